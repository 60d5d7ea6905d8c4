"""A prefill row that passes a prefix-cache boundary (``plan.RowSnapshot``): its linear mixers run in
two parts inside the one forward and the state between them lands in a snapshot row. It must equal
what a prefill stopped at the boundary leaves in its slot, and the row's logits and final state must
equal those of the row run whole (fp32), on every linear-layer kind, beside other rows."""

from __future__ import annotations

import pytest
import torch

from hypic_agent.runtime.runner.plan import RowSnapshot, plan_forward
from hypic_agent.runtime.runner.pool import StatePool
from hypic_agent.runtime.runner.runner import ModelRunner

from .conftest import make_model, rand_tokens

CPU = torch.device("cpu")
TOL = dict(rtol=1e-4, atol=1e-4)


def _pool(model) -> StatePool:
    return StatePool(model.config, slots=6, kv_tokens=1024, page_size=8, device=CPU, dtype=torch.float32, snapshots=4)


@pytest.mark.parametrize("split_last", [True, False], ids=["split-row-last", "split-row-first"])
@pytest.mark.parametrize("arch", ["qwen3_5_text", "granitemoehybrid", "kimi_linear", "falcon_h1"])
def test_a_split_row_snapshots_the_boundary_state_and_runs_as_the_whole_row(arch, split_last):
    """The split row last in the plan (the mixers slice its parts: ``LinearSplit.cut``) or first (they
    gather and scatter them)."""
    model, _, _ = make_model(arch)
    head, split_row, other = rand_tokens(9, 1), rand_tokens(29, 2), rand_tokens(17, 3)
    off = 12  # the boundary: 9 + 12 tokens into the sequence, inside the row and not page-aligned

    # reference: the row stopped at the boundary (the slot's state there), then its rest
    ref_pool = _pool(model)
    ref = ModelRunner(model, ref_pool)
    a, b = ref_pool.alloc(64), ref_pool.alloc(64)
    assert a is not None and b is not None
    ref.forward(plan_forward(ref_pool, [a], [head]))
    ref.forward(plan_forward(ref_pool, [a], [split_row[:off]]))
    want_rec = ref_pool.recurrent[:, a.slot].clone()
    want_conv = ref_pool.conv[:, a.slot].clone()
    want = ref.forward(plan_forward(ref_pool, [b, a], [other, split_row[off:]]))
    if not split_last:
        want = want.flip(0)

    pool = _pool(model)
    runner = ModelRunner(model, pool)
    x, y = pool.alloc(64), pool.alloc(64)
    assert x is not None and y is not None
    runner.forward(plan_forward(pool, [x], [head]))
    snap = pool.take_snapshot()
    assert snap is not None
    if split_last:
        plan = plan_forward(pool, [y, x], [other, split_row], snapshots=[RowSnapshot(1, off, snap)])
    else:
        plan = plan_forward(pool, [x, y], [split_row, other], snapshots=[RowSnapshot(0, off, snap)])
    assert plan.split is not None and plan.split.cut == (len(other) + off if split_last else None)
    got = runner.forward(plan)

    torch.testing.assert_close(pool.snap_recurrent[:, snap], want_rec, **TOL)
    torch.testing.assert_close(pool.snap_conv[:, snap], want_conv, **TOL)
    assert not torch.allclose(want_rec, ref_pool.recurrent[:, a.slot], atol=1e-3)  # the boundary is not the end
    torch.testing.assert_close(got, want, **TOL)  # both rows' last logits (the other row unaffected)
    torch.testing.assert_close(pool.recurrent[:, x.slot], ref_pool.recurrent[:, a.slot], **TOL)
    torch.testing.assert_close(pool.conv[:, x.slot], ref_pool.conv[:, a.slot], **TOL)
    torch.testing.assert_close(pool.recurrent[:, y.slot], ref_pool.recurrent[:, b.slot], **TOL)
    assert x.length == 9 + 29


def test_a_snapshot_offset_outside_its_row_is_refused():
    model, _, _ = make_model("qwen3_5_text")
    pool = _pool(model)
    s = pool.alloc(32)
    assert s is not None
    for bad in (RowSnapshot(0, 0, 0), RowSnapshot(0, 5, 0), RowSnapshot(1, 2, 0)):
        with pytest.raises(ValueError, match="inside pool row"):
            plan_forward(pool, [s], [rand_tokens(5, 1)], snapshots=[bad])
