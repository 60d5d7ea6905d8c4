"""The project's Triton kernels against their torch twins on CPU, through Triton's interpreter
(``TRITON_INTERPRET=1``): kernel logic (indexing, masks, pointer tables, both body variants) is
checked in CI; speed and tensor-core precision are checked on the GPU (test_gpu_gdn.py).

Needs ``triton`` (CI installs it; skipped otherwise) and numpy < 2.4 for Triton 3.6's
interpreter. Each case runs in a subprocess: the interpreter is chosen when triton is imported.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kernels.helpers import run_in_interpreter

ROOT = Path(__file__).resolve().parents[2]

CHAIN = """
import torch
from hypic_agent.kernels.chain import chain_scan_torch
from hypic_agent.kernels.chain.chain_triton import chain_scan_triton
from tests.kernels.helpers import rel_err
g = torch.Generator().manual_seed(0)
for HV, K, V, n in ((3, 32, 24, 5), (2, 20, 16, 0)):
    h0 = torch.randn(HV, K, V, generator=g)
    T = torch.randn(n, HV, K, K, generator=g) * 0.1
    S = torch.randn(n, HV, K, V, generator=g)
    ref = chain_scan_torch(h0, T, S)
    for chunked in (False, True):
        assert rel_err(chain_scan_triton(h0, T, S, chunked=chunked), ref) < 1e-6, (HV, K, V, n, chunked)
        Tb, Sb = T.bfloat16(), S.bfloat16()  # bf16 pairs are read as stored, accumulated in fp32
        got = chain_scan_triton(h0, Tb, Sb, chunked=chunked)
        assert rel_err(got, chain_scan_torch(h0, Tb, Sb)) < 1e-5, ("bf16", HV, K, V, n, chunked)
    for Tx, Sx in ((T, S), (T.bfloat16(), S.bfloat16())):  # the final state only, kept in registers
        last = chain_scan_triton(h0, Tx, Sx, last_only=True)
        assert last.shape == (HV, K, V) and rel_err(last, chain_scan_torch(h0, Tx, Sx)[-1]) < 1e-5
"""

CHAIN_POINTERS = """
import torch
from hypic_agent.kernels.chain import compose_bodies, compose_body_pointers
from tests.kernels.helpers import rel_err
g = torch.Generator().manual_seed(3)
L, n, HV, K, V = 3, 4, 2, 20, 24
for dt in (torch.float32, torch.bfloat16):
    pairs = [[((torch.eye(K) * 0.9 + 0.05 * torch.randn(HV, K, K, generator=g)).to(dt).contiguous(),
               torch.randn(HV, K, V, generator=g).to(dt)) for _ in range(n)] for _ in range(L)]
    ptrs = torch.tensor([[(T.data_ptr(), S.data_ptr()) for T, S in chain] for chain in pairs], dtype=torch.int64)
    for tr in (True, False):
        ref = compose_bodies(pairs, transition=tr)
        got = compose_body_pointers(ptrs, pairs[0][0], transition=tr)
        assert got.shape == (L, HV, K, V) and rel_err(got, ref) < 1e-5, (dt, tr, rel_err(got, ref))
    one = compose_body_pointers(ptrs[:, :1].contiguous(), pairs[0][0])  # a single body: its S
    assert torch.equal(one, torch.stack([c[0][1].float() for c in pairs]))
"""

COMBINE_TABLES = """
# combine() through the Triton launch tables (pairs read by pointer; a w = 0 prompt's leading bodies
# composed for all layers in one launch first) against the torch twin, on a tiny model
import functools
from unittest import mock
import torch
from hypic_agent.kernels import combine_scan, gather_spans
from hypic_agent.kernels.combine_scan import combine_scan_triton as combine_scan_wy_triton
from hypic_agent.kernels.config import KernelConfig
from hypic_agent.runtime.hypic import combine as comb
from hypic_agent.runtime.hypic import splice
from hypic_agent.runtime.hypic import combine_inputs as combine_inputs_mod
from hypic_agent.runtime.hypic.combine_inputs import combine_inputs
from hypic_agent.runtime.hypic.build import build_entries
from hypic_agent.runtime.hypic.layout import plan_layout
from hypic_agent.runtime.hypic.modes import mode_spec
from tests.kernels.helpers import rel_err
from tests.runtime.conftest import make_model, rand_tokens
model, _, _ = make_model("qwen3_5_text")
segs = [tuple(rand_tokens(n, 3 + n)) for n in (30, 17, 40)]
suffix = rand_tokens(5, 2)
fixed_wy = functools.partial(combine_scan_wy_triton.wy_chain_triton, bv=16, num_warps=2)
cases = (("hypic", [6, 6, 6]), ("transition", [0, 0, 0]), ("addition", [0, 0, 0]))
for mode, seams in cases:
    entries = build_entries(model, segs, seams)
    lay = plan_layout(list(segs), list(entries), seams, suffix, torch.device("cpu"))
    ref = comb.combine(model, lay, list(entries), mode_spec(mode), fused_scan=True)
    with mock.patch.object(combine_inputs_mod, "resolve_triton", lambda b, d: True), \
            mock.patch.object(splice, "resolve_triton", lambda b, d: True), \
            mock.patch.object(gather_spans, "resolve_triton", lambda b, d: True), \
            mock.patch.object(combine_scan, "resolve_triton", lambda b, d: True), \
            mock.patch.object(combine_scan_wy_triton, "wy_chain_triton", fixed_wy):
        kernels = KernelConfig()
        inputs = combine_inputs(model, lay, list(entries), mode != "addition", True, kernels=kernels)
        assert all(p is not None and p.tables is not None for p in inputs.plan.values()), mode
        assert (inputs.lead is not None) == (seams[0] == 0), mode
        assert inputs.by_pointer() and inputs.kernels is kernels, mode  # conv tails, attention bodies by pointer
        assert inputs.tables()._steps is not None, mode  # the WY steps planned up front
        got = comb.combine(model, lay, list(entries), mode_spec(mode), fused_scan=True, kernels=kernels)
    assert rel_err(got.last_logits, ref.last_logits) < 1e-4, (mode, rel_err(got.last_logits, ref.last_logits))
    for a, b in zip(got.layers, ref.layers):
        if hasattr(a, "recurrent"):
            assert rel_err(a.recurrent, b.recurrent) < 1e-4, mode
"""

COMBINE_WY = """
# the WY scan: its factor kernel against the torch twin, the whole scan against the token-loop twin
import torch
from hypic_agent.kernels.combine_scan import Body, Piece, chain_tables, gdn_combine_scan_torch
from hypic_agent.kernels.combine_scan import plan_steps, wy_factors_torch
from hypic_agent.kernels.combine_scan.combine_scan_triton import wy_chain_triton, wy_factors_triton
from tests.kernels.helpers import gdn_inputs, rel_err
H, HV, K, V = 2, 4, 32, 48
x = gdn_inputs(100, H, HV, K, V, seed=5)
g = torch.Generator().manual_seed(0)
for dt in (torch.float32, torch.bfloat16):
    def body():
        T = (torch.eye(K) * 0.9 + 0.01 * torch.randn(HV, K, K, generator=g)).to(dt).contiguous()
        return Body(T, torch.randn(HV, K, V, generator=g).to(dt))
    # a leading body, a window, two bodies in a row, an empty piece, an 18-token and a 70-token piece
    chain = [body(), Piece(0, 5), body(), Piece(5, 12), body(), body(), Piece(12, 12), Piece(12, 30), Piece(30, 100)]
    h0 = torch.randn(HV, K, V, generator=g)
    tab = chain_tables([chain], torch.device("cpu"))
    for cs in (16, 64):
        st = plan_steps(tab.meta_host, tab.ptrs_host, torch.device("cpu"), cs)
        f = wy_factors_triton(**x, chunks=st.chunks, chunk_size=cs)
        for a, b in zip(f, wy_factors_torch(**x, chunks=st.chunks, chunk_size=cs)):
            assert rel_err(a, b) < 1e-5, (dt, cs, rel_err(a, b))
        for tr in (True, False):
            ro, rh = gdn_combine_scan_torch(**x, chain=chain, h0=h0, transition=tr)
            for bv, stages in ((16, 1), (32, 2)):
                o, h = wy_chain_triton(f, st.meta, st.ptrs[0], h0, torch.float32, cs, pair_dtype=tab.pair_dtype,
                                       transition=tr, bv=bv, num_warps=2, stages=stages)
                assert rel_err(o, ro) < 1e-5 and rel_err(h, rh) < 1e-5, (dt, cs, tr, bv, rel_err(o, ro), rel_err(h, rh))
# q, k, v as row-strided views of one packed tensor (the conv output split into heads): read in place
qkv = torch.cat([x["q"].reshape(100, -1), x["k"].reshape(100, -1), x["v"].reshape(100, -1)], dim=1)
q_, k_, v_ = torch.split(qkv, [H * K, H * K, HV * V], dim=1)
views = dict(x, q=q_.view(100, H, K), k=k_.view(100, H, K), v=v_.view(100, HV, V))
assert not views["q"].is_contiguous()
for a, b in zip(wy_factors_triton(**views, chunks=st.chunks, chunk_size=64), f):
    assert torch.equal(a, b)
# the dispatcher's WY branch (chunk size picked by the planner), at a fixed launch shape
import functools
from unittest import mock
from hypic_agent.kernels import combine_scan
from hypic_agent.kernels.combine_scan import combine_scan_triton as combine_scan_wy_triton
fixed = functools.partial(wy_chain_triton, bv=16, num_warps=2)
with mock.patch.object(combine_scan, "resolve_triton", lambda b, d: True), \
        mock.patch.object(combine_scan_wy_triton, "wy_chain_triton", fixed):
    o, h = combine_scan.gdn_combine_scan(**x, chain=chain, h0=h0)
ro, rh = gdn_combine_scan_torch(**x, chain=chain, h0=h0)
assert rel_err(o, ro) < 1e-5 and rel_err(h, rh) < 1e-5, (rel_err(o, ro), rel_err(h, rh))
"""

BODY_PAIRS = """
import torch
from hypic_agent.kernels.gdn import gdn_torch
from hypic_agent.kernels.body_pairs import body_pairs_torch
from hypic_agent.kernels.body_pairs.body_pairs_triton import body_pairs_triton
from hypic_agent.kernels.gdn import gated_delta_rule
from hypic_agent.kernels.pair_sink import PairSink
from hypic_agent.kernels.seam_split import SeamSplit
from tests.kernels.helpers import gdn_inputs, rel_err
lens, seams = [40, 3, 70, 9, 130], [8, 3, 0, 4, 2]  # window + body, window only, body only, 3-chunk body
H, HV, K, V = 2, 4, 20, 16
x = gdn_inputs(sum(lens), H, HV, K=K, V=V, seed=7)
sp = SeamSplit.build(lens, seams, torch.device("cpu"))
_, S_win = gated_delta_rule(**{n: t[sp.win_idx] for n, t in x.items()}, cu_seqlens=sp.cu_win, backend="torch")
S_win_z = sp.with_zero_row(S_win)
_, fin = gated_delta_rule(**x, cu_seqlens=sp.cu_sub, initial_state=sp.enter_from_windows(S_win_z), backend="torch")
kn = gdn_torch.l2norm(x["k"].float())
w, _, gc = gdn_torch.wy_factors(kn, x["v"], x["g"], x["beta"], sp.cu_sub.tolist())
ref = PairSink.stacked(sp.n, HV, K, V, torch.device("cpu"), torch.float32)
body_pairs_torch(kn[None], w[None], gc[None], fin, S_win_z, sp, ref)
for bv in (16, 32):  # one and two column blocks of T per program
    got = PairSink.stacked(sp.n, HV, K, V, torch.device("cpu"), torch.float32)
    body_pairs_triton(kn[None], w[None], gc[None], fin, S_win_z, sp, got, bv=bv, num_warps=2)
    for a, b in zip(got.stacks(), ref.stacks()):
        assert rel_err(a, b) < 1e-6, (bv, rel_err(a, b))
"""

MOE = """
import torch
from hypic_agent.kernels.moe import moe_experts
from hypic_agent.kernels.moe_route import align_torch as align
from hypic_agent.kernels.moe.moe_triton import moe_experts_triton
from tests.kernels.helpers import rel_err
g = torch.Generator().manual_seed(0)
E, D, I = 6, 48, 40  # neither a multiple of the tiles
gate_up = torch.randn(E, 2 * I, D, generator=g) * 0.2
down = torch.randn(E, D, I, generator=g) * 0.2
for T, K, E_used in ((9, 2, E), (1, 2, E), (40, 2, 3)):  # experts without rows; experts over several blocks
    x = torch.randn(T, D, generator=g)
    idx = torch.stack([torch.randperm(E_used, generator=g)[:K] for _ in range(T)])
    w = torch.softmax(torch.randn(T, K, generator=g), -1)
    ref = moe_experts(x, idx, w, gate_up, down, backend="torch")
    for bm, bn, bk in ((16, 16, 16), (16, 32, 32)):
        got = moe_experts_triton(x, idx, w, gate_up, down, block_m=bm, bn=bn, bk=bk, num_warps=2, stages=1)
        assert rel_err(got, ref) < 1e-5, (T, K, bm, bn, bk, rel_err(got, ref))
# rows sorted by expert, padded to whole blocks; blocks past the last used one are marked -1
ids, be = align(torch.tensor([[2, 0], [2, 1], [2, 0]]), 4, 2)
assert ids.tolist() == [1, 5, 3, 6, 0, 2, 4, 6] + [6] * 6 and be.tolist() == [0, 1, 2, 2, -1, -1, -1]
"""

SPLITK = """
import torch
from hypic_agent.kernels.attention import attention
from hypic_agent.kernels.attention.attention_triton import splitk_attention_triton
from tests.kernels.helpers import rel_err
g = torch.Generator().manual_seed(0)
Tq, Hq, Hkv, D, Dv, Tk = 9, 4, 2, 32, 24, 300
q, k = torch.randn(Tq, Hq, D, generator=g), torch.randn(Tk, Hkv, D, generator=g)
v = torch.randn(Tk, Hkv, Dv, generator=g)
kp = torch.arange(5, 5 + Tk)  # keys start at position 5: the query at 2 sees nothing (zeros)
qp = torch.tensor([2, 7, 40, 41, 120, 200, 250, 298, 304])
ref = attention(q, k, v, q_positions=qp, k_positions=kp, scale=0.2, backend="torch")
assert ref[0].abs().max() == 0
for asc in (False, True):  # the up-front count of visible key blocks (ascending keys) or a check per block
    for ns, block in ((1, (16, 32, 4)), (3, (32, 16, 4)), (7, (16, 64, 2))):
        o = splitk_attention_triton(q, k, v, qp, kp, 0.2, num_splits=ns, block=block, keys_ascending=asc)
        assert rel_err(o, ref) < 1e-5 and o[0].abs().max() == 0, (asc, ns, block, rel_err(o, ref))
# keys out of order: the per-block check still finds every visible key
perm = torch.randperm(Tk, generator=g)
ref = attention(q, k[perm], v[perm], q_positions=qp, k_positions=kp[perm], scale=0.2, backend="torch")
o = splitk_attention_triton(q, k[perm], v[perm], qp, kp[perm], 0.2, num_splits=3, block=(16, 32, 4))
assert rel_err(o, ref) < 1e-5, rel_err(o, ref)
"""

CONV = """
import torch
from hypic_agent.kernels.conv import causal_conv1d
from hypic_agent.kernels.conv.conv_triton import causal_conv1d_triton
g = torch.Generator().manual_seed(0)
lens = [5, 1, 0, 2, 40]
cu = torch.tensor([0, 5, 6, 6, 8, 48])
C, W = 200, 4
x, w, b = torch.randn(48, C, generator=g), torch.randn(C, W, generator=g), torch.randn(C, generator=g)
h0 = torch.randn(5, C, W - 1, generator=g)
for init in (h0, None):
    for bias, act in ((b, "silu"), (None, None)):
        ry, rf = causal_conv1d(x, w, bias, cu_seqlens=cu, initial_state=init, activation=act, backend="torch")
        y, f = causal_conv1d_triton(x, w, bias, cu, init, act == "silu")
        assert torch.allclose(y, ry, atol=1e-5) and torch.equal(f, rf), ((y - ry).abs().max(), (f - rf).abs().max())
"""

GATHER = """
# span gather by pointer (conv tails, attention bodies): zero spans, offsets, partial blocks, bf16
import torch
from hypic_agent.kernels.gather_spans import gather_spans_torch, span_table
from hypic_agent.kernels.gather_spans.gather_spans_triton import gather_spans_triton
g = torch.Generator().manual_seed(0)
for dt in (torch.float32, torch.bfloat16):
    srcs = [torch.randn(n, generator=g).to(dt) for n in (5000, 3, 4096)] + [None]
    numels, offsets = [4100, 3, 4096, 7], [0, 4100, 4110, 8300]
    table = span_table([(0 if s is None else s.data_ptr(), o, n) for s, o, n in zip(srcs, offsets, numels)])
    ref = gather_spans_torch(srcs, offsets, numels, torch.full((8307,), 7.0, dtype=dt))
    got = gather_spans_triton(table, torch.full((8307,), 7.0, dtype=dt), max(numels))
    assert torch.equal(got, ref), (dt, (got.float() - ref.float()).abs().max())
    assert torch.equal(got[4103:4110], torch.full((7,), 7.0, dtype=dt))  # gaps between spans untouched
"""


COMBINE_WY_MERGED = """
# three requests' chains in one launch (merge_steps: each over its own rows, from its own h0) equal
# each chain alone (the token-loop twin on its rows); also through the dispatcher of the merged scan
import torch
from hypic_agent.kernels.combine_scan import Body, Piece, chain_tables, gdn_combine_scan_merged, gdn_combine_scan_torch
from hypic_agent.kernels.combine_scan import merge_steps
from hypic_agent.kernels.combine_scan.combine_scan_triton import wy_chain_triton, wy_factors_triton
from tests.kernels.helpers import gdn_inputs, rel_err
H, HV, K, V = 2, 4, 32, 48
x = gdn_inputs(90, H, HV, K, V, seed=7)
g = torch.Generator().manual_seed(1)
def body():
    T = (torch.eye(K) * 0.9 + 0.01 * torch.randn(HV, K, K, generator=g)).contiguous()
    return Body(T, torch.randn(HV, K, V, generator=g))
# request rows: [0, 30), [30, 40), [40, 90); chains in each request's own row numbers
chains = [
    [body(), Piece(0, 8), body(), Piece(8, 30)],
    [Piece(0, 4), body(), body(), Piece(4, 10)],
    [body(), Piece(0, 8), body(), Piece(8, 16), body(), Piece(16, 50)],
]
offsets, ends = [0, 30, 40], [30, 40, 90]
h0 = torch.randn(3, HV, K, V, generator=g)
tabs = [chain_tables([c, c], torch.device("cpu")) for c in chains]  # two layers, same pairs
st = merge_steps(tabs, offsets, torch.device("cpu"))
assert st.bounds.tolist()[0] == 0 and len(st.bounds) == 4 and st.ptrs.shape[0] == 2
f = wy_factors_triton(**x, chunks=st.chunks, chunk_size=st.chunk_size)
for tr in (True, False):
    o, h = wy_chain_triton(f, st.meta, st.ptrs[1], h0, torch.float32, st.chunk_size, transition=tr, bv=16,
                           num_warps=2, bounds=st.bounds)
    assert h.shape == (3, HV, K, V)
    for n, (c, a, b) in enumerate(zip(chains, offsets, ends)):
        xs = {key: t[a:b] for key, t in x.items()}
        ro, rh = gdn_combine_scan_torch(**xs, chain=c, h0=h0[n], transition=tr)
        assert rel_err(o[a:b], ro) < 1e-5 and rel_err(h[n], rh) < 1e-5, (tr, n, rel_err(o[a:b], ro), rel_err(h[n], rh))
# a request's rows alone give what the merged launch gave it (no cross-talk between chains)
o1, h1 = wy_chain_triton(f, st.meta, st.ptrs[0], h0, torch.float32, st.chunk_size, bv=16, num_warps=2, bounds=st.bounds)
import functools
from unittest import mock
from hypic_agent.kernels.combine_scan import combine_scan_triton as wy_module
with mock.patch.object(wy_module, "wy_chain_triton", functools.partial(wy_chain_triton, bv=16, num_warps=2)):
    om, hm = gdn_combine_scan_merged(**x, steps=st, row=0, h0=h0, pair_dtype=torch.float32)
assert rel_err(om, o1) < 1e-6 and rel_err(hm, h1) < 1e-6
"""


@pytest.mark.parametrize(
    "name,script",
    [
        ("chain_scan", CHAIN),
        ("chain_pointers", CHAIN_POINTERS),
        ("combine_tables", COMBINE_TABLES),
        ("combine_scan_wy", COMBINE_WY),
        ("combine_scan_wy_merged", COMBINE_WY_MERGED),
        ("body_pairs", BODY_PAIRS),
        ("moe", MOE),
        ("splitk_attention", SPLITK),
        ("conv", CONV),
        ("gather_spans", GATHER),
    ],
)
def test_triton_kernel_matches_torch_twin(name, script):
    run_in_interpreter(name, script)
