"""gated_delta_rule_with_pairs (CPU reference) and SeamSplit: outputs, finals and body pairs."""

from __future__ import annotations

import pytest
import torch

from hypic_agent.kernels.gdn import gated_delta_rule
from hypic_agent.kernels.gdn_pairs import (
    PairSink,
    SeamSplit,
    gated_delta_rule_into_pairs,
    gated_delta_rule_with_pairs,
)
from hypic_agent.kernels.pairs import apply_pair
from tests.kernels.helpers import gdn_inputs, rel_err

LENS = [40, 3, 70, 9]
SEAMS = [8, 3, 0, 4]  # window + body, all window, all body, window + body


def _cu(lens: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)


def test_seam_split_indices():
    sp = SeamSplit.build(LENS, SEAMS, torch.device("cpu"))
    assert sp.seam_segs == [0, 1, 3] and sp.body_segs == [0, 2, 3]
    assert sp.cu_body.tolist() == [0, 32, 102, 107]
    assert sp.body_idx[:32].tolist() == list(range(8, 40)) and sp.body_idx[-5:].tolist() == list(range(117, 122))
    # sub-sequences: [window 8, body 32] [window 3] [body 70] [window 4, body 5]
    assert sp.sub_lens == [8, 32, 3, 70, 4, 5] and sp.cu_sub.tolist() == [0, 8, 40, 43, 113, 117, 122]
    assert sp.body_sub.tolist() == [1, 3, 5] and sp.seg_last_sub.tolist() == [1, 2, 3, 5]
    assert sp.sub_chunks.tolist() == [[0, 0], [1, 0], [2, 0], [3, 0], [3, 1], [4, 0], [5, 0]]
    assert sp.sub_chunk_offsets.tolist() == [0, 1, 2, 3, 5, 6, 7]
    # windows: [0, 8) [40, 43) [113, 117); entering windows per sub-sequence / body (3 = zero)
    assert sp.win_idx.tolist() == [*range(8), 40, 41, 42, 113, 114, 115, 116] and sp.cu_win.tolist() == [0, 8, 11, 15]
    assert sp.win_chunks.tolist() == [[0, 0], [1, 0], [2, 0]] and sp.win_chunk_offsets.tolist() == [0, 1, 2, 3]
    assert sp.sub_enter_win.tolist() == [3, 0, 3, 3, 3, 2] and sp.body_enter_win.tolist() == [0, 3, 2]
    # per segment: its body sub-sequence (-1: none) and the window entering it (3: none)
    assert sp.seg_body_sub.tolist() == sp.seg_body_sub_host == [1, -1, 3, 5]
    assert sp.seg_body_win.tolist() == sp.seg_body_win_host == [0, 3, 3, 2]
    with pytest.raises(ValueError, match="seams"):
        SeamSplit.build([4], [5], torch.device("cpu"))


def test_outputs_finals_and_pairs_compose():
    x = {n: t.double() for n, t in gdn_inputs(sum(LENS), 2, 4, K=16, V=8, seed=3).items()}
    cu = _cu(LENS)
    sp = SeamSplit.build(LENS, SEAMS, torch.device("cpu"))
    o, fin, T, S = gated_delta_rule_with_pairs(**x, cu_seqlens=cu, split=sp, backend="torch")
    o_ref, fin_ref = gated_delta_rule(**x, cu_seqlens=cu, backend="torch")
    assert torch.equal(o, o_ref.to(o.dtype)) and torch.equal(fin, fin_ref)
    # body pair applied to the state after the window == whole-segment final state
    starts = cu.tolist()
    for j, (n, w) in enumerate(zip(LENS, SEAMS, strict=True)):
        a = starts[j]
        win = {k: v[a : a + w] for k, v in x.items()}
        h_win = gated_delta_rule(**win, backend="torch")[1] if w else torch.zeros(1, 4, 16, 8, dtype=torch.float64)
        assert h_win is not None
        got = apply_pair(T[j].double(), S[j].double(), h_win[0].double())
        assert rel_err(got, fin[j].double()) < 1e-5, j
    eye = torch.eye(16).expand(4, 16, 16)
    assert torch.equal(T[1], eye) and torch.equal(S[1], torch.zeros_like(S[1]))  # no body: (I, 0)


def test_window_pass_plumbing_equals_the_reference():
    """The fla build's bookkeeping with torch ops: one varlen pass over windows and bodies as
    sub-sequences, the windows' own zero-start pass giving the states entering the bodies, and the
    body pairs from that pass's WY factors and final states (``body_pairs_torch``: T from the
    identity, ``S_body = fin - T_body S_win``), equals the reference's outputs, finals and pairs."""
    from hypic_agent.kernels.body_pairs import body_pairs_torch
    from hypic_agent.kernels.gdn import gdn_torch

    x = {n: t.double() for n, t in gdn_inputs(sum(LENS), 2, 4, K=16, V=8, seed=7).items()}
    sp = SeamSplit.build(LENS, SEAMS, torch.device("cpu"))
    _, S_win = gated_delta_rule(**{n: t[sp.win_idx] for n, t in x.items()}, cu_seqlens=sp.cu_win, backend="torch")
    assert S_win is not None
    S_win = sp.with_zero_row(S_win.double())
    h0 = sp.enter_from_windows(S_win)
    o, fin_sub = gated_delta_rule(**x, cu_seqlens=sp.cu_sub, initial_state=h0, backend="torch")
    assert fin_sub is not None
    kn = gdn_torch.l2norm(x["k"])
    w, _, gc = gdn_torch.wy_factors(kn, x["v"], x["g"], x["beta"], sp.cu_sub.tolist())
    sink = PairSink.stacked(sp.n, 4, 16, 8, torch.device("cpu"), torch.float64)
    body_pairs_torch(kn[None], w[None], gc[None], fin_sub, S_win, sp, sink)
    got = (o, sp.segment_finals(fin_sub), *sink.stacks())
    ref = gated_delta_rule_with_pairs(**x, cu_seqlens=_cu(LENS), split=sp, backend="torch")
    for a, b in zip(got, ref, strict=True):
        assert rel_err(a.double(), b.double()) < 1e-5  # transition_pairs runs in fp32


def test_into_pairs_writes_each_entrys_own_tensors():
    """Entry building hands the entries' tensors over as a sink: every segment's pair lands in its
    own (bf16 here) tensors, equal to the stacked fp32 result rounded."""
    x = gdn_inputs(sum(LENS), 2, 4, K=16, V=8, seed=9)
    sp = SeamSplit.build(LENS, SEAMS, torch.device("cpu"))
    T_own = [torch.full((4, 16, 16), float("nan"), dtype=torch.bfloat16) for _ in LENS]
    S_own = [torch.full((4, 16, 8), float("nan"), dtype=torch.bfloat16) for _ in LENS]
    o, fin = gated_delta_rule_into_pairs(**x, cu_seqlens=_cu(LENS), split=sp, sink=PairSink.over(T_own, S_own))
    ro, _, rT, rS = gated_delta_rule_with_pairs(**x, cu_seqlens=_cu(LENS), split=sp, backend="torch")
    assert fin is None and torch.equal(o, ro)
    for j in range(len(LENS)):
        assert torch.equal(T_own[j], rT[j].bfloat16()) and torch.equal(S_own[j], rS[j].bfloat16()), j
    with pytest.raises(ValueError, match="sink holds 2 pairs for 4 segments"):
        gated_delta_rule_into_pairs(**x, cu_seqlens=_cu(LENS), split=sp, sink=PairSink.over(T_own[:2], S_own[:2]))


def test_pair_sink_checks_its_tensors():
    T, S = [torch.zeros(2, 4, 4)], [torch.zeros(2, 4, 3)]
    sink = PairSink.over(T, S)
    assert sink.pointers.tolist() == [[T[0].data_ptr(), S[0].data_ptr()]] and sink.dtype == torch.float32
    assert torch.equal(sink.stacks()[0], T[0][None])
    with pytest.raises(ValueError, match="one dtype"):
        PairSink.over(T, [S[0].bfloat16()])
    with pytest.raises(ValueError, match="contiguous"):
        PairSink.over([torch.zeros(2, 4, 4).transpose(1, 2)], S)
    with pytest.raises(ValueError, match="one T and one S"):
        PairSink.over(T, [])
    st = PairSink.stacked(3, 2, 4, 3, torch.device("cpu"), torch.bfloat16)
    Ts, Ss = st.stacks()
    assert Ts.shape == (3, 2, 4, 4) and st.T[1].data_ptr() == Ts[1].data_ptr()
    st.fill(torch.ones(3, 2, 4, 4), torch.full((3, 2, 4, 3), 2.0))
    assert bool((Ts == 1).all()) and bool((Ss == 2).all())


def test_split_must_cover_the_batch():
    x = gdn_inputs(sum(LENS), 2, 4, K=16, V=8)
    sp = SeamSplit.build(LENS[:2], SEAMS[:2], torch.device("cpu"))
    with pytest.raises(ValueError, match="covers"):
        gated_delta_rule_with_pairs(**x, cu_seqlens=_cu(LENS), split=sp, backend="torch")


def test_after_pairs_hands_over_the_pieces_pairs_and_runs_from_the_states():
    from hypic_agent.kernels.gdn_pairs import gated_delta_rule_after_pairs
    from hypic_agent.kernels.pairs import transition_pairs

    lens = [5, 17, 9]
    x = {n: t.double() for n, t in gdn_inputs(sum(lens), 2, 4, K=16, V=8, seed=5).items()}
    cu = _cu(lens)
    h0 = torch.randn(3, 4, 16, 8, dtype=torch.float64)
    seen = {}

    def enter(T, S):
        seen["T"], seen["S"] = T, S
        return h0

    o, fin = gated_delta_rule_after_pairs(**x, cu_seqlens=cu, enter=enter, backend="torch")
    T_ref, S_ref = transition_pairs(x["k"], x["v"], x["g"], x["beta"], cu_seqlens=cu, backend="torch")
    assert rel_err(seen["T"], T_ref) < 1e-12 and rel_err(seen["S"], S_ref) < 1e-12
    o_ref, fin_ref = gated_delta_rule(**x, cu_seqlens=cu, initial_state=h0, backend="torch")
    assert rel_err(o, o_ref) < 1e-12 and rel_err(fin, fin_ref) < 1e-12


def test_shared_fla_failure_falls_back_once(monkeypatch, caplog):
    import sys
    import types

    from hypic_agent.kernels import gdn_pairs

    calls = []

    def broken(*_a):
        calls.append(1)
        raise TypeError("signature drift")

    fake = types.ModuleType("hypic_agent.kernels.gdn_pairs.gdn_pairs_fla")
    fake.gdn_with_pairs_fla = broken  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "hypic_agent.kernels.gdn_pairs.gdn_pairs_fla", fake)
    monkeypatch.setattr(gdn_pairs, "_SHARED_FAILED", [])
    import hypic_agent.kernels.gdn_pairs as kpkg

    monkeypatch.setattr(kpkg, "gdn_pairs_fla", fake, raising=False)
    assert gdn_pairs._shared_fla(lambda m: m.gdn_with_pairs_fla()) is None
    assert gdn_pairs._shared_fla(lambda m: m.gdn_with_pairs_fla()) is None
    assert calls == [1] and "signature drift" in gdn_pairs._SHARED_FAILED[0]
    assert "separate fla passes" in caplog.text
    monkeypatch.setattr(gdn_pairs, "_SHARED_FAILED", [])

    def oom(_m):
        raise torch.cuda.OutOfMemoryError("out of memory")

    with pytest.raises(torch.cuda.OutOfMemoryError):
        gdn_pairs._shared_fla(oom)
    assert gdn_pairs._SHARED_FAILED == []
