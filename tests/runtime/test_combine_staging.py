"""Staged body pairs of the families' combine graphs, on CPU (capture and replay against eager on the
H200: ``test_gpu_families.py::test_combine_graph_replays_match_eager``)."""

from __future__ import annotations

import pytest
import torch

from hypic_agent.kernels.config import KernelConfig
from hypic_agent.runtime.hypic.build import build_entries
from hypic_agent.runtime.hypic.combine import _graphable, combine
from hypic_agent.runtime.hypic.combine_staging import StagedPairs
from hypic_agent.runtime.hypic.entry import LinearEntry, SegmentEntry
from hypic_agent.runtime.hypic.layout import plan_layout
from hypic_agent.runtime.hypic.modes import mode_spec

from .conftest import make_model, rand_tokens

CPU = torch.device("cpu")


def _requests(model, orders, seam=6, length=30):
    pool = [tuple(rand_tokens(length, 300 + i)) for i in range(5)]
    entries = build_entries(model, pool, [seam] * len(pool))
    out = []
    for j, order in enumerate(orders):
        es = [entries[i] for i in order]
        out.append((plan_layout([pool[i] for i in order], es, [seam] * len(order), rand_tokens(5, 40 + j), CPU), es))
    return out


def _splice_in(staged: list[SegmentEntry | None], real: list[SegmentEntry | None]) -> list[SegmentEntry | None]:
    """What the graph reads: the staged pairs, and (by pointer, on CUDA) the request's own conv tails
    and keys / values."""
    out: list[SegmentEntry | None] = []
    for s, r in zip(staged, real, strict=True):
        assert s is not None and r is not None
        layers = [
            LinearEntry(sl.T, sl.S, rl.conv_tail) if isinstance(sl, LinearEntry) else rl  # type: ignore[union-attr]
            for sl, rl in zip(s.layers, r.layers, strict=True)
        ]
        out.append(SegmentEntry(r.token_ids, r.seam, layers, r.prefill_ms))
    return out


@pytest.mark.parametrize("arch", ["kimi_linear", "granitemoehybrid", "bailing_hybrid"])
def test_filled_buffers_serve_another_request_of_the_layout(arch):
    model, _, _ = make_model(arch)
    (lay1, e1), (lay2, e2) = _requests(model, [[0, 1, 2], [3, 4, 1]])
    assert lay1.shape_key == lay2.shape_key
    staged = StagedPairs.stage(lay1, e1)
    n_lin = sum(isinstance(le, LinearEntry) for le in e1[0].layers)
    assert len(staged.buffers) == 2 * n_lin * 3  # T and S of every linear layer of the three bodies
    first = staged.entries[0].layers[0]
    assert isinstance(first, LinearEntry) and isinstance(e1[0].layers[0], LinearEntry)
    assert first.T.data_ptr() != e1[0].layers[0].T.data_ptr() and torch.equal(first.T, e1[0].layers[0].T)
    spec = mode_spec("hypic")
    before = [t.clone() for t in _pairs_of(e1)]
    staged.fill(lay2, e2)
    assert all(torch.equal(a, b) for a, b in zip(before, _pairs_of(e1), strict=True))  # e1's own pairs untouched
    for s, r in zip(staged.entries, e2, strict=True):  # in chain order: request 2's pairs, layer by layer
        for sl, rl in zip(s.layers, r.layers, strict=True):
            if isinstance(sl, LinearEntry):
                assert torch.equal(sl.T, rl.T) and torch.equal(sl.S, rl.S)
    got = combine(model, lay2, _splice_in(staged.entries, e2), spec).last_logits
    ref = combine(model, lay2, e2, spec).last_logits
    other = combine(model, lay1, e1, spec).last_logits
    assert torch.allclose(got, ref, atol=1e-5) and not torch.allclose(ref, other, atol=1e-3)


def _pairs_of(entries):
    return [t for e in entries for le in e.layers if isinstance(le, LinearEntry) for t in (le.T, le.S)]


def test_fill_refuses_pairs_it_was_not_staged_for():
    model, _, _ = make_model("kimi_linear")
    (lay1, e1), (lay2, e2) = _requests(model, [[0, 1], [2, 3]])
    staged = StagedPairs.stage(lay1, e1)

    def halved(le):
        return LinearEntry(le.T.half(), le.S.half(), le.conv_tail) if isinstance(le, LinearEntry) else le

    half = [SegmentEntry(e.token_ids, e.seam, [halved(le) for le in e.layers]) for e in e2]
    with pytest.raises(ValueError, match="staged"):
        staged.fill(lay2, half)
    ((lay3, e3),) = _requests(model, [[0, 1, 2]])
    with pytest.raises(ValueError, match="body pairs"):
        staged.fill(lay3, e3)


def test_graphable_needs_recurrent_scans_for_kda_and_decay_kinds():
    kimi, _, _ = make_model("kimi_linear")
    ((lay, _),) = _requests(kimi, [[0, 1, 2]])
    kinds = {layer.mixer_kind for layer in kimi.layers} - {"attention"}
    assert kinds == {"kda"}
    assert _graphable(kimi, lay, kinds)  # the default covers a combine's few active tokens
    kimi.set_kernels(KernelConfig(recurrent_scan_max_tokens=lay.active_ids.numel() - 1))
    assert not _graphable(kimi, lay, kinds)  # one token more than the recurrent path takes: chunked
    kimi.set_kernels(KernelConfig(recurrent_scan_max_tokens=0))
    assert not _graphable(kimi, lay, kinds)
    qwen, _, _ = make_model("qwen3_5_text")
    qwen.set_kernels(KernelConfig(recurrent_scan_max_tokens=0))
    assert _graphable(qwen, lay, {"gdn"})  # GDN's fused scan reads no host value
