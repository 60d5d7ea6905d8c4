"""Combine graphs on CPU: layout keys, pointer tables and their in-place refresh, capture admission
(capture and replay against eager on the H200: test_gpu_model.py)."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from hypic_agent.kernels.config import KernelConfig
from hypic_agent.runtime.hypic import combine_inputs as ci
from hypic_agent.runtime.hypic import splice
from hypic_agent.runtime.hypic.build import build_entries
from hypic_agent.runtime.hypic.layout import plan_layout
from hypic_agent.runtime.hypic.modes import mode_spec

from .conftest import make_model, rand_tokens

CPU = torch.device("cpu")


def _pool(model, n=5, length=20, seam=4):
    segs = [tuple(rand_tokens(length, 100 + i)) for i in range(n)]
    return segs, build_entries(model, segs, [seam] * n)


def test_shape_key_follows_lengths_seams_and_hits_not_tokens():
    model, _, _ = make_model("qwen3_5_text")
    segs, entries = _pool(model)
    q1, q2 = rand_tokens(6, 1), rand_tokens(6, 2)
    a = plan_layout([segs[0], segs[1]], [entries[0], entries[1]], [4, 4], q1, CPU)
    b = plan_layout([segs[3], segs[2]], [entries[3], entries[2]], [4, 4], q2, CPU)
    assert a.shape_key == b.shape_key  # other segments, other order, other question: one layout
    assert torch.equal(a.active_pos, b.active_pos) and torch.equal(a.body_pos, b.body_pos)
    assert a.body_starts == b.body_starts == [4, 24]
    other = [
        plan_layout([segs[0], segs[1]], [entries[0], entries[1]], [4, 4], q1[:5], CPU),  # question length
        plan_layout([segs[0], segs[1]], [entries[0], None], [4, 4], q1, CPU),  # a miss
        plan_layout([segs[0], segs[1]], [entries[0], entries[1]], [4, 3], q1, CPU),  # a seam
        plan_layout([segs[0], segs[1][:10]], [entries[0], None], [4, 4], q1, CPU),  # a length
    ]
    assert len({a.shape_key, *(x.shape_key for x in other)}) == 5


@pytest.mark.parametrize("mode,seam", [("hypic", 4), ("transition", 0)])
def test_refreshed_tables_equal_freshly_planned_ones(mode, seam):
    """The pointer tables of one request rewritten in place for another request of the same layout
    equal the tables planned for that request (what a graph replay reads), and every pointer is
    the right entry tensor (plus the seam rows it skips)."""
    model, _, _ = make_model("qwen3_5_text")
    segs, entries = _pool(model, seam=seam)
    q = rand_tokens(6, 3)
    lay_a = plan_layout([segs[0], segs[1], segs[2]], [entries[0], entries[1], entries[2]], [seam] * 3, q, CPU)
    order = [4, 0, 3]
    e_b = [entries[i] for i in order]
    lay_b = plan_layout([segs[i] for i in order], e_b, [seam] * 3, q, CPU)
    spec = mode_spec(mode)
    with (
        mock.patch.object(ci, "resolve_triton", lambda b, d: True),
        mock.patch.object(splice, "resolve_triton", lambda b, d: True),
    ):
        wy = KernelConfig()
        e_a = [entries[0], entries[1], entries[2]]
        planned = ci.combine_inputs(model, lay_a, e_a, spec.transition, True, kernels=wy)
        fresh = ci.combine_inputs(model, lay_b, e_b, spec.transition, True, kernels=wy)
    assert planned.by_pointer() and (planned.lead is not None) == (seam == 0)
    planned.refresh(model, lay_b, e_b)
    ta, tb = planned.tables(), fresh.tables()
    assert ta is not None and tb is not None and ta._steps is not None and tb._steps is not None
    assert torch.equal(ta.ptrs, tb.ptrs) and torch.equal(ta._steps.ptrs, tb._steps.ptrs)
    if seam == 0:
        assert planned.lead is not None and fresh.lead is not None
        assert torch.equal(planned.lead.ptrs, fresh.lead.ptrs)
    sa, sb = planned.splice, fresh.splice
    assert sa is not None and sb is not None
    for x, y in ((sa.conv, sb.conv), (sa.keys, sb.keys), (sa.values, sb.values)):
        assert torch.equal(x, y)
    att = [i for i, layer in enumerate(model.layers) if layer.self_attn is not None]
    k0 = e_b[0].layers[att[0]].k  # type: ignore[union-attr]
    row = k0.shape[1] * k0.shape[2] * k0.element_size()
    assert sb.keys[0, 0, 0].item() == k0.data_ptr() + seam * row  # the body starts after the seam rows
    assert sb.values[0, 1, 1].item() == lay_b.body_starts[1] * k0.shape[1] * k0.shape[2]


def test_refresh_refuses_entries_of_another_dtype():
    model, _, _ = make_model("qwen3_5_text")
    segs, entries = _pool(model)
    q = rand_tokens(6, 3)
    lay = plan_layout([segs[0], segs[1]], [entries[0], entries[1]], [4, 4], q, CPU)
    bf16 = build_entries(model, [segs[2], segs[3]], [4, 4], pair_dtype=torch.bfloat16)
    with (
        mock.patch.object(ci, "resolve_triton", lambda b, d: True),
        mock.patch.object(splice, "resolve_triton", lambda b, d: True),
    ):
        planned = ci.combine_inputs(model, lay, [entries[0], entries[1]], True, True)
    with pytest.raises(ValueError, match="planned for"):
        planned.refresh(model, plan_layout([segs[2], segs[3]], list(bf16), [4, 4], q, CPU), list(bf16))


def test_capture_admission_keeps_hot_layouts():
    """Layouts are captured on their second sighting while slots are free; once full, a layout
    replaces the least-seen kept one only when it has been seen more often, so a stream of new
    layouts (new question lengths) never makes every request capture."""
    from hypic_agent.runtime.runner import combine_graphs as cg

    model, _, _ = make_model("qwen3_5_text")
    r = cg.CombineGraphs(model, capture_after=2, max_graphs=2)

    def sight(key, n=1):
        out = False
        for _ in range(n):
            out = r.note(key)
            if out:  # what a capture does with the slots
                if len(r.graphs) >= r.max_graphs:
                    del r.graphs[r._victim()]
                r.graphs[key] = None
        return out

    assert not sight("a") and sight("a") and "a" in r.graphs  # second sighting: captured
    sight("a", 5)  # replays count as sightings
    sight("b", 2)
    assert set(r.graphs) == {"a", "b"}
    for k in ("c", "d", "e", "f"):  # one-offs seen twice: b (seen twice) is not beaten
        assert not sight(k, 2)
    assert set(r.graphs) == {"a", "b"}
    assert sight("c", 1)  # c's third sighting beats b's two: it takes b's slot
    assert set(r.graphs) == {"a", "c"}
    r.capture_after = 0
    assert not r.usable(plan_layout([(1, 2, 3)], [None], [0], [4], CPU))  # 0 turns graphs off (and CPU)
