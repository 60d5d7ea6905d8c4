"""GPU: decay-only attention through fla-core's ``chunk_simple_gla`` (``kernels.decay_attention`` with
``backend="fla"``) against the torch twin on the same inputs: packed prefill from initial states over
grouped q / k, and pairs that compose.

Shapes: Mamba2 (1 group of B / C for 8 heads, d_state 128, head dim 64, as Granite 4 / Nemotron-H),
the tiny test models' (2 groups, 4 heads, 16 x 32) and Lightning's (groups = heads, 64 x 64). Log-decays
span Mamba2's range (``dt * A`` from ~0 to ~-8 per token). Tolerances (relative Frobenius error): fp32
5e-3 (TF32 dots), bf16 q / k 2e-2 (fla casts v to bf16 and keeps the per-chunk states behind the
outputs in bf16; the reference runs fp32 on the same bf16 q / k and the fp32 v).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hypic_agent.kernels import decay_attention as decay
from tests.kernels.helpers import rel_err

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
LENS = [300, 1, 0, 77, 64, 129]  # a 1-token and an empty sequence, lengths off the 64-token chunks
TOL = {torch.float32: 5e-3, torch.bfloat16: 2e-2}
SHAPES = [(1, 8, 128, 64), (2, 4, 16, 32), (4, 4, 64, 64)]  # (G, H, K, V)


def _cu(lens: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")


def _inputs(t: int, shape: tuple[int, int, int, int], dtype: torch.dtype, seed: int = 0, slow: bool = False):
    """q, k ``[T, G, K]`` in ``dtype``, v ``[T, H, V]`` fp32 (as Mamba2's ``dt * x``), g ``[T, H]`` fp32
    (``slow``: within -0.002 per token, so that an incoming state survives a span)."""
    gr, h, kd, vd = shape
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(t, gr, kd, generator=gen).to("cuda", dtype) for _ in range(2))
    v = torch.randn(t, h, vd, generator=gen).cuda()
    g = -torch.rand(t, h, generator=gen) * 0.002 if slow else -F.softplus(2 * torch.randn(t, h, generator=gen) - 1)
    return q, k, v, g.cuda()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_chunk_matches_torch(dtype, shape):
    q, k, v, g = _inputs(sum(LENS), shape, dtype)
    cu = _cu(LENS)
    h0 = torch.randn(len(LENS), shape[1], shape[2], shape[3], device="cuda")
    o_f, s_f = decay.decay_attention(q, k, v, g, cu_seqlens=cu, initial_state=h0, backend="fla")
    o_t, s_t = decay.decay_attention(q, k, v, g, cu_seqlens=cu, initial_state=h0, backend="torch")
    eo, es = rel_err(o_f.float(), o_t), rel_err(s_f, s_t)
    print(f"chunk {dtype} G,H,K,V={shape}: rel err o {eo:.2e} state {es:.2e}")
    assert o_f.shape == o_t.shape and s_f.dtype == torch.float32 and s_f.shape == h0.shape
    assert eo < TOL[dtype] and es < TOL[dtype]
    assert torch.equal(s_f[2], h0[2])  # the empty sequence keeps its state


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES[:2])
def test_pairs_match_torch_and_compose(dtype, shape):
    q, k, v, g = _inputs(sum(LENS), shape, dtype, seed=2, slow=True)
    cu = _cu(LENS)
    T_f, S_f = decay.decay_pairs(k, v, g, cu_seqlens=cu, backend="fla")
    T_t, S_t = decay.decay_pairs(k, v, g, cu_seqlens=cu, backend="torch")
    eT, eS = rel_err(T_f, T_t), rel_err(S_f, S_t)
    print(f"pairs {dtype} {shape}: rel err T {eT:.2e} S {eS:.2e}")
    assert T_f.shape == (len(LENS), shape[1]) and eT < 1e-5 and eS < TOL[dtype]
    assert torch.equal(T_f[2], torch.ones_like(T_f[2])) and not S_f[2].any()  # the empty sequence: (1, 0)
    # T * S_in + S: chaining the spans' pairs from h0 gives the state of one pass over all of them
    h0 = 10 * torch.randn(1, *S_f.shape[1:], device="cuda")  # about the norm of the spans' S: T shows
    _, s_one = decay.decay_attention(q, k, v, g, initial_state=h0, backend="fla")
    _, s_ref = decay.decay_attention(q, k, v, g, initial_state=h0, backend="torch")
    states = decay.decay_chain(h0[0], T_f, S_f)
    ec, ef = rel_err(states[-1], s_ref[0]), rel_err(states[-1], s_one[0])
    naive = rel_err(S_f.sum(0) + h0[0], s_ref[0])
    print(f"pairs {dtype} {shape}: composed vs one pass {ec:.2e} (fla one pass {ef:.2e}), naive {naive:.2e}")
    assert ec < TOL[dtype] and ef < TOL[dtype] and naive > 0.1


SHORT = [8, 1, 0, 8, 50]  # a combine's pieces: seam windows, an empty one, the question


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES[:2])
def test_recurrent_path_matches_torch_and_is_capturable(dtype, shape):
    """Short varlen scans (``recurrent_max_tokens``) take fused_recurrent_simple_gla: the twin's outputs,
    states and pairs, and a CUDA graph captures them (no host read of ``cu_seqlens``)."""
    q, k, v, g = _inputs(sum(SHORT), shape, dtype, seed=3)
    cu = _cu(SHORT)
    h0 = torch.randn(len(SHORT), shape[1], shape[2], shape[3], device="cuda")
    kw = dict(cu_seqlens=cu, initial_state=h0)
    o_f, s_f = decay.decay_attention(q, k, v, g, backend="fla", recurrent_max_tokens=256, **kw)
    o_t, s_t = decay.decay_attention(q, k, v, g, backend="torch", **kw)
    assert rel_err(o_f.float(), o_t) < TOL[dtype] and rel_err(s_f, s_t) < TOL[dtype]
    assert torch.equal(s_f[2], h0[2])
    T_f, S_f = decay.decay_pairs(k, v, g, cu_seqlens=cu, backend="fla", recurrent_max_tokens=256)
    T_t, S_t = decay.decay_pairs(k, v, g, cu_seqlens=cu, backend="torch")
    assert rel_err(T_f, T_t) < 1e-5 and rel_err(S_f, S_t) < TOL[dtype]
    ins = [x.clone() for x in (q, k, v, g)]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_g, s_g = decay.decay_attention(*ins, backend="fla", recurrent_max_tokens=256, **kw)
    for dst, src in zip(ins, _inputs(sum(SHORT), shape, dtype, seed=4), strict=True):
        dst.copy_(src)
    graph.replay()
    o_r, s_r = decay.decay_attention(*ins, backend="torch", **kw)
    assert rel_err(o_g.float(), o_r) < TOL[dtype] and rel_err(s_g, s_r) < TOL[dtype]
