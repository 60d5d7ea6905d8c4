"""GPU: KDA through fla-core (``kernels.kda`` with ``backend="fla"``) against the torch twin on the same
inputs: packed prefill from initial states, the decode step, the pool-slot step, and pairs that compose.

Tolerances (relative Frobenius error): fp32 inputs 5e-3 (fla's dots run in TF32, ~1e-3), bf16 inputs
2e-2 (fla rounds its intra-chunk factors and the states behind the outputs to bf16; the reference runs
fp32 on the same bf16-rounded values), as for GDN (``test_gpu_gdn``). The pairs promote their inputs
to fp32 before fla, so both dtypes meet 5e-3 there.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hypic_agent.kernels import kda
from hypic_agent.kernels.chain import chain_scan
from hypic_agent.kernels.kda import kda_torch
from tests.kernels.helpers import rel_err

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
LENS = [300, 1, 0, 77, 64, 129]  # a 1-token and an empty sequence, lengths off the 64-token chunks
TOL = {torch.float32: 5e-3, torch.bfloat16: 2e-2}


def _cu(lens: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")


def _inputs(t: int, h: int, kd: int, vd: int, dtype: torch.dtype, seed: int = 0, slow: bool = False):
    """q, k ``[T, H, K]`` and v ``[T, H, V]`` in ``dtype``; g ``[T, H, K]`` fp32 log-decays (Kimi's gate
    range: softplus-shaped, per channel from ~0 to ~-3; ``slow``: within -0.002, so that the delta rule's
    erasing, not the decay, sets how much of an incoming state survives a span); beta ``[T, H]``."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(t, h, d, generator=gen) for d in (kd, kd, vd))
    g = -torch.rand(t, h, kd, generator=gen) * 0.002 if slow else -F.softplus(torch.randn(t, h, kd, generator=gen))
    beta = torch.sigmoid(torch.randn(t, h, generator=gen))
    return [x.to("cuda", dtype) for x in (q, k, v)] + [g.cuda(), beta.to("cuda", dtype)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("h,kd,vd", [(4, 128, 128), (2, 16, 16)])
def test_chunk_matches_torch(dtype, h, kd, vd):
    q, k, v, g, beta = _inputs(sum(LENS), h, kd, vd, dtype)
    cu = _cu(LENS)
    h0 = torch.randn(len(LENS), h, kd, vd, device="cuda")
    o_f, s_f = kda.kda(q, k, v, g, beta, cu_seqlens=cu, initial_state=h0, backend="fla")
    o_t, s_t = kda.kda(q, k, v, g, beta, cu_seqlens=cu, initial_state=h0, backend="torch")
    eo, es = rel_err(o_f.float(), o_t), rel_err(s_f, s_t)
    print(f"chunk {dtype} H={h} K={kd}: rel err o {eo:.2e} state {es:.2e}")
    assert o_f.dtype == dtype and s_f.dtype == torch.float32 and s_f.shape == h0.shape
    assert eo < TOL[dtype] and es < TOL[dtype]
    assert torch.equal(s_f[2], h0[2])  # the empty sequence keeps its state


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_step_and_slots_match_torch(dtype):
    q, k, v, g, beta = _inputs(5, 4, 128, 128, dtype, seed=1)
    st = torch.randn(5, 4, 128, 128, device="cuda")
    o_f, s_f = kda.kda_step(q, k, v, g, beta, st, backend="fla")
    o_t, s_t = kda.kda_step(q, k, v, g, beta, st, backend="torch")
    print(f"step {dtype}: rel err o {rel_err(o_f.float(), o_t):.2e} state {rel_err(s_f, s_t):.2e}")
    assert rel_err(o_f.float(), o_t) < TOL[dtype] and rel_err(s_f, s_t) < TOL[dtype]
    pool = torch.randn(8, 4, 128, 128, device="cuda")
    before = pool.clone()
    slots = torch.tensor([6, 0, 3, 7, 2], device="cuda")
    o_p = kda.kda_decode_slots(q, k, v, g, beta, pool, slots, backend="fla")
    o_r, s_r = kda_torch.kda_step(q, k, v, g, beta, before[slots])
    assert rel_err(o_p.float(), o_r) < TOL[dtype] and rel_err(pool[slots], s_r) < TOL[dtype]
    rest = torch.tensor([1, 4, 5], device="cuda")
    assert torch.equal(pool[rest], before[rest])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pairs_match_torch_and_compose(dtype):
    q, k, v, g, beta = _inputs(sum(LENS), 4, 128, 128, dtype, seed=2, slow=True)
    cu = _cu(LENS)
    T_f, S_f = kda.kda_pairs(k, v, g, beta, cu_seqlens=cu, backend="fla")
    T_t, S_t = kda.kda_pairs(k, v, g, beta, cu_seqlens=cu, backend="torch")
    eT, eS = rel_err(T_f, T_t), rel_err(S_f, S_t)
    print(f"pairs {dtype}: rel err T {eT:.2e} S {eS:.2e}")
    assert T_f.shape == (len(LENS), 4, 128, 128) and eT < 5e-3 and eS < 5e-3
    eye = torch.eye(128, device="cuda").expand(4, 128, 128)
    assert torch.allclose(T_f[2], eye) and not S_f[2].any()  # the empty sequence: (I, 0)
    # T @ S_in + S: chaining the spans' pairs from h0 gives the state of one pass over all of them
    h0 = torch.randn(1, 4, 128, 128, device="cuda")
    _, s_one = kda.kda(q, k, v, g, beta, initial_state=h0, backend="fla")
    _, s_ref = kda.kda(q, k, v, g, beta, initial_state=h0, backend="torch")
    states = chain_scan(h0[0], T_f, S_f, backend="torch")
    ec, ef = rel_err(states[-1], s_ref[0]), rel_err(states[-1], s_one[0])
    naive = rel_err(S_f.sum(0) + h0[0], s_ref[0])
    print(f"pairs {dtype}: composed vs one pass {ec:.2e} (fla one pass {ef:.2e}), naive addition {naive:.2e}")
    assert ec < 5e-3 and ef < TOL[dtype] and naive > 0.1


SHORT = [8, 1, 0, 8, 50]  # a combine's pieces: seam windows, an empty one, the question


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_recurrent_path_matches_torch_and_is_capturable(dtype):
    """Short varlen scans (``recurrent_max_tokens``) take fused_recurrent_kda: the twin's outputs, states
    and pairs, and a CUDA graph captures them (no host read of ``cu_seqlens``) and replays new inputs."""
    q, k, v, g, beta = _inputs(sum(SHORT), 4, 128, 128, dtype, seed=3)
    cu = _cu(SHORT)
    h0 = torch.randn(len(SHORT), 4, 128, 128, device="cuda")
    o_f, s_f = kda.kda(q, k, v, g, beta, cu_seqlens=cu, initial_state=h0, backend="fla", recurrent_max_tokens=256)
    o_t, s_t = kda.kda(q, k, v, g, beta, cu_seqlens=cu, initial_state=h0, backend="torch")
    assert rel_err(o_f.float(), o_t) < TOL[dtype] and rel_err(s_f, s_t) < TOL[dtype]
    assert torch.equal(s_f[2], h0[2])
    T_f, S_f = kda.kda_pairs(k, v, g, beta, cu_seqlens=cu, backend="fla", recurrent_max_tokens=256)
    T_t, S_t = kda.kda_pairs(k, v, g, beta, cu_seqlens=cu, backend="torch")
    assert rel_err(T_f, T_t) < 5e-3 and rel_err(S_f, S_t) < 5e-3
    ins = [x.clone() for x in (q, k, v, g, beta)]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_g, s_g = kda.kda(*ins, cu_seqlens=cu, initial_state=h0, backend="fla", recurrent_max_tokens=256)
    q2, k2, v2, g2, b2 = _inputs(sum(SHORT), 4, 128, 128, dtype, seed=4)
    for dst, src in zip(ins, (q2, k2, v2, g2, b2), strict=True):
        dst.copy_(src)
    graph.replay()
    o_r, s_r = kda.kda(q2, k2, v2, g2, b2, cu_seqlens=cu, initial_state=h0, backend="torch")
    assert rel_err(o_g.float(), o_r) < TOL[dtype] and rel_err(s_g, s_r) < TOL[dtype]
