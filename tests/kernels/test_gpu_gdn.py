"""GPU: fla GDN / pairs and the Triton chain scan against the torch references (same inputs)."""

from __future__ import annotations

import pytest
import torch

from hypic_agent.kernels.chain import chain_scan
from hypic_agent.kernels.gdn import gated_delta_rule, gated_delta_rule_step
from hypic_agent.kernels.pairs import transition_pairs
from tests.kernels.helpers import gdn_inputs, rel_err

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
LENS = [300, 1, 0, 777, 64, 129]


def _cu(lens: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")


def _inputs(dtype: torch.dtype, K: int = 128, V: int = 128, H: int = 2, HV: int = 4, seed: int = 0):
    return gdn_inputs(sum(LENS), H, HV, K=K, V=V, seed=seed, device="cuda", dtype=dtype)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 5e-3), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("K,H,HV", [(128, 2, 4), (64, 2, 2)])
def test_chunk_matches_torch(dtype, tol, K, H, HV):
    x = _inputs(dtype, K=K, V=K, H=H, HV=HV)
    cu = _cu(LENS)
    h0 = torch.randn(len(LENS), HV, K, K, device="cuda")
    o_f, s_f = gated_delta_rule(**x, cu_seqlens=cu, initial_state=h0, backend="fla")
    o_t, s_t = gated_delta_rule(**x, cu_seqlens=cu, initial_state=h0, backend="torch")
    eo, es = rel_err(o_f.float(), o_t.float()), rel_err(s_f, s_t)
    print(f"chunk {dtype} K={K} H={H} HV={HV}: rel err o {eo:.2e} state {es:.2e}")
    assert o_f.dtype == dtype and s_f.dtype == torch.float32
    assert eo < tol and es < tol


def test_step_matches_torch():
    x = gdn_inputs(5, 2, 4, K=128, V=128, seed=1, device="cuda")
    st = torch.randn(5, 4, 128, 128, device="cuda")
    o_f, s_f = gated_delta_rule_step(*x.values(), st, backend="fla")
    o_t, s_t = gated_delta_rule_step(*x.values(), st, backend="torch")
    print(f"step: rel err o {rel_err(o_f, o_t):.2e} state {rel_err(s_f, s_t):.2e}")
    assert rel_err(o_f, o_t) < 5e-3 and rel_err(s_f, s_t) < 5e-3


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 5e-3), (torch.bfloat16, 2e-2)])
def test_pairs_match_torch_and_compose(dtype, tol):
    x = _inputs(dtype, seed=2)
    cu = _cu(LENS)
    kvgb = (x["k"], x["v"], x["g"], x["beta"])
    T_f, S_f = transition_pairs(*kvgb, cu_seqlens=cu, backend="fla")
    T_t, S_t = transition_pairs(*kvgb, cu_seqlens=cu, backend="torch")
    eT, eS = rel_err(T_f, T_t), rel_err(S_f, S_t)
    print(f"pairs {dtype}: rel err T {eT:.2e} S {eS:.2e}")
    assert eT < tol and eS < tol
    # orientation: composing fla pairs equals one pass over the concatenation
    h0 = torch.randn(1, 4, 128, 128, device="cuda")
    _, s_one = gated_delta_rule(**x, initial_state=h0, backend="torch")
    states = chain_scan(h0[0], T_f, S_f, backend="auto")
    ec = rel_err(states[-1], s_one[0])
    naive = rel_err(S_f.sum(0) + h0[0], s_one[0])
    print(f"pairs {dtype}: composed vs one pass {ec:.2e}, naive addition {naive:.2e}")
    assert ec < tol and naive > 0.1


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("HV,K,V,n", [(32, 128, 128, 64), (4, 64, 96, 5), (2, 100, 40, 3), (3, 16, 16, 0)])
def test_chain_triton_matches_torch(HV, K, V, n, chunked):
    g = torch.Generator(device="cuda").manual_seed(3)
    h0 = torch.randn(HV, K, V, device="cuda", generator=g)
    T = torch.randn(n, HV, K, K, device="cuda", generator=g) * 0.45 / K**0.5  # contractive
    S = torch.randn(n, HV, K, V, device="cuda", generator=g)
    out_tr = chain_scan(h0, T, S, backend="fla", chunked=chunked)
    out_t = chain_scan(h0, T, S, backend="torch")
    err = rel_err(out_tr, out_t) if n else float((out_tr - out_t).abs().max())
    print(f"chain chunked={chunked} HV={HV} K={K} V={V} n={n}: rel err {err:.2e}")
    assert out_tr.shape == (n + 1, HV, K, V) and err < 5e-5


@pytest.mark.parametrize("pair_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("HV,K,V,n", [(32, 128, 128, 64), (4, 64, 96, 5), (3, 16, 16, 0)])
def test_chain_triton_last_only_and_bf16_pairs(HV, K, V, n, pair_dtype):
    """The register-resident variant returns the final state; bf16 pairs (two bf16 passes over a
    hi/lo split state) match the fp32 loop over the same (bf16-rounded) pairs."""
    g = torch.Generator(device="cuda").manual_seed(5)
    h0 = torch.randn(HV, K, V, device="cuda", generator=g)
    T = (torch.randn(n, HV, K, K, device="cuda", generator=g) * 0.45 / K**0.5).to(pair_dtype)
    S = torch.randn(n, HV, K, V, device="cuda", generator=g).to(pair_dtype)
    ref = chain_scan(h0, T, S, backend="torch")
    last = chain_scan(h0, T, S, backend="fla", last_only=True)
    every = chain_scan(h0, T, S, backend="fla")
    err = rel_err(last, ref[-1]), rel_err(every, ref)
    print(f"chain last_only {pair_dtype} HV={HV} K={K} V={V} n={n}: rel err last {err[0]:.2e} all {err[1]:.2e}")
    assert last.shape == (HV, K, V) and max(err) < 5e-5
    if pair_dtype == torch.bfloat16 and n:  # one bf16 dot per pair: the state rounded to bf16 for it
        fast = rel_err(chain_scan(h0, T, S, backend="fla", last_only=True, state_bf16=True), ref[-1])
        print(f"  state_bf16: rel err {fast:.2e}")
        assert fast < 5e-3


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 5e-3), (torch.bfloat16, 3e-2)])
def test_gdn_with_pairs_fla_matches_reference(dtype, tol):
    from hypic_agent.kernels.gdn_pairs import SeamSplit, gated_delta_rule_with_pairs

    lens, seams = [300, 1, 777, 64, 129, 8], [8, 1, 8, 0, 16, 8]
    x = gdn_inputs(sum(lens), 2, 4, K=128, V=128, seed=4, device="cuda", dtype=dtype)
    cu = _cu(lens)
    sp = SeamSplit.build(lens, seams, torch.device("cuda"))
    got = gated_delta_rule_with_pairs(**x, cu_seqlens=cu, split=sp, backend="fla")
    ref = gated_delta_rule_with_pairs(**{n: t.float() for n, t in x.items()}, cu_seqlens=cu, split=sp, backend="torch")
    errs = [rel_err(a.float(), b.float()) for a, b in zip(got, ref, strict=True)]
    print(f"gdn+pairs {dtype}: rel err o {errs[0]:.2e} final {errs[1]:.2e} T {errs[2]:.2e} S {errs[3]:.2e}")
    assert got[0].dtype == dtype and all(t.dtype == torch.float32 for t in got[1:])
    assert max(errs) < tol


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pair_dtype", [torch.float32, torch.bfloat16])
def test_body_pairs_triton_matches_twin(dtype, pair_dtype):
    """The body-pair kernels on fla's own factors against the fp32 twin on the same factors; with
    bf16 pairs ``S`` follows the stored (rounded) ``T``, so ``T S_win + S`` still gives ``fin``."""
    from fla.ops.gated_delta_rule.chunk_fwd import chunk_gated_delta_rule_fwd_intra
    from fla.ops.utils import chunk_local_cumsum
    from fla.ops.utils.constant import RCP_LN2

    from hypic_agent.kernels.body_pairs import body_pairs_torch
    from hypic_agent.kernels.body_pairs.body_pairs_triton import body_pairs_triton
    from hypic_agent.kernels.gdn import gdn_torch
    from hypic_agent.kernels.gdn_pairs import PairSink, SeamSplit

    lens, seams = [300, 1, 777, 64, 129, 8], [8, 1, 8, 0, 16, 8]
    HV, K, V = 4, 128, 128
    x = gdn_inputs(sum(lens), 2, HV, K=K, V=V, seed=8, device="cuda", dtype=dtype)
    x["g"] = x["g"] * 0.01  # slow decay: T stays far from 0 over hundreds of tokens
    sp = SeamSplit.build(lens, seams, torch.device("cuda"))
    kn = gdn_torch.l2norm(x["k"].float()).to(dtype)[None].contiguous()
    gc = chunk_local_cumsum(x["g"][None].contiguous(), chunk_size=64, scale=RCP_LN2, cu_seqlens=sp.cu_sub,
                            chunk_indices=sp.sub_chunks)  # fmt: skip
    w, _, _ = chunk_gated_delta_rule_fwd_intra(
        k=kn, v=x["v"][None].contiguous(), g=gc, beta=x["beta"].to(dtype)[None].contiguous(), cu_seqlens=sp.cu_sub,
        chunk_size=64, chunk_indices=sp.sub_chunks,
    )  # fmt: skip
    fin = torch.randn(len(sp.sub_lens), HV, K, V, device="cuda")
    S_win_z = sp.with_zero_row(torch.randn(len(sp.seam_segs), HV, K, V, device="cuda"))
    ref = PairSink.stacked(sp.n, HV, K, V, torch.device("cuda"), torch.float32)
    body_pairs_torch(kn, w, gc, fin, S_win_z, sp, ref)
    got = PairSink.stacked(sp.n, HV, K, V, torch.device("cuda"), pair_dtype)
    body_pairs_triton(kn, w, gc, fin, S_win_z, sp, got)
    (T, S), (rT, rS) = got.stacks(), ref.stacks()
    eT = rel_err(T.float(), rT)
    # S against the twin's formula on the stored T: the kernels' own S step, about fp32
    S_own = fin[sp.seg_body_sub.clamp_min(0)] - T.float() @ S_win_z[sp.seg_body_win]
    S_own[sp.seg_body_sub < 0] = 0
    eS = rel_err(S.float(), S_own.to(pair_dtype).float())
    print(f"body pairs {dtype} -> {pair_dtype}: T {eT:.2e} S(own T) {eS:.2e} S(twin) {rel_err(S.float(), rS):.2e}")
    # fp32 inputs take tf32 dots (Triton's default, as in fla's state pass); a bf16 S can round apart
    assert eT < (1e-2 if dtype == torch.bfloat16 else 5e-3) and eS < (1e-5 if pair_dtype == torch.float32 else 1e-3)
    assert torch.equal(T[1].float(), torch.eye(K, device="cuda").expand(HV, K, K)) and not S[1].any()  # no body


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 5e-3), (torch.bfloat16, 3e-2)])
def test_gdn_after_pairs_fla_matches_reference(dtype, tol):
    from hypic_agent.kernels.gdn_pairs import gated_delta_rule_after_pairs

    lens = [8, 300, 8, 50]
    x = gdn_inputs(sum(lens), 2, 4, K=128, V=128, seed=6, device="cuda", dtype=dtype)
    cu = _cu(lens)
    base = torch.randn(len(lens), 4, 128, 128, device="cuda")

    def enter(T, S):  # depends on the pairs, as the combine chain does
        return torch.matmul(T, base) + S

    got = gated_delta_rule_after_pairs(**x, cu_seqlens=cu, enter=enter, backend="fla")
    xf = {n: t.float() for n, t in x.items()}
    ref = gated_delta_rule_after_pairs(**xf, cu_seqlens=cu, enter=enter, backend="torch")
    eo, ef = rel_err(got[0].float(), ref[0].float()), rel_err(got[1], ref[1])
    print(f"gdn after pairs {dtype}: rel err o {eo:.2e} final {ef:.2e}")
    assert got[0].dtype == dtype and eo < tol and ef < tol


def _seam_chain(HV: int, K: int, V: int, n: int, question: int, pair_dtype: torch.dtype, g: torch.Generator):
    """A RAG combine chain on CUDA: n 8-token seam pieces, each followed by a cached body (contractive
    T, random S, drawn from ``g``), then a ``question``-token piece."""
    from hypic_agent.kernels.combine_scan import Body, Piece

    chain: list[Piece | Body] = []
    for i in range(n):
        chain.append(Piece(8 * i, 8 * i + 8))
        T = torch.eye(K, device="cuda") * 0.5 + 0.02 * torch.randn(HV, K, K, device="cuda", generator=g)
        S = torch.randn(HV, K, V, device="cuda", generator=g)
        chain.append(Body(T.to(pair_dtype).contiguous(), S.to(pair_dtype)))
    chain.append(Piece(8 * n, 8 * n + question))
    return chain


@pytest.mark.parametrize("pair_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("transition", [True, False])
def test_combine_scan_wy_matches_twin(pair_dtype, transition):
    """The WY scan (chunk factors in parallel, then a chain of chunk + body steps) against the token-loop
    twin at the Qwen3.5 shape (20 seams of 8 tokens around cached bodies, a 50-token question): both
    chunk sizes, the dispatcher's default launch and one fixed launch shape, precise and one-pass
    state dots. (Launch-shape timings: ``benchmarks/combine_kernels.py``.)"""
    from hypic_agent.kernels.combine_scan import chain_tables, gdn_combine_scan, gdn_combine_scan_torch, plan_steps
    from hypic_agent.kernels.combine_scan.combine_scan_triton import wy_chain_triton, wy_factors_triton

    HV, K, V = 32, 128, 128
    x = gdn_inputs(20 * 8 + 50, 16, HV, K=K, V=V, seed=10, device="cuda", dtype=torch.bfloat16)
    g = torch.Generator(device="cuda").manual_seed(2)
    chain = _seam_chain(HV, K, V, 20, 50, pair_dtype, g)
    h0 = torch.randn(HV, K, V, device="cuda", generator=g)
    tab = chain_tables([chain], torch.device("cuda"))
    ro, rh = gdn_combine_scan_torch(**{n: t.float() for n, t in x.items()}, chain=chain, h0=h0, transition=transition)
    for cs in (16, 64):
        st = plan_steps(tab.meta_host, tab.ptrs_host, torch.device("cuda"), cs)
        f = wy_factors_triton(**x, chunks=st.chunks, chunk_size=cs)
        for precise in (True, False):  # tf32x3 state dots, or one tf32 pass (the bf16 default)
            o, h = wy_chain_triton(
                f, st.meta, st.ptrs[0], h0, torch.bfloat16, cs, pair_dtype=pair_dtype, transition=transition,
                bv=32, num_warps=4, stages=1, precise=precise,
            )  # fmt: skip
            eo, eh = rel_err(o.float(), ro.float()), rel_err(h, rh)
            assert o.dtype == torch.bfloat16 and eo < 2e-2 and eh < (1e-3 if precise else 4e-3), (cs, precise, eo, eh)
    o, h = gdn_combine_scan(**x, chain=chain, h0=h0, transition=transition)  # planner's chunk size, autotuned
    assert rel_err(o.float(), ro.float()) < 2e-2 and rel_err(h, rh) < 4e-3
