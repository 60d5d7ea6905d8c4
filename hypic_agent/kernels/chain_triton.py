"""Fused chain scan in Triton (CUDA; imported lazily so CPU installs never need triton).

One launch, grid ``(cdiv(V, BV), HV)``: each program keeps its ``[K, BV]`` slice of the running
state in registers and walks the n pairs, ``h <- T[i] @ h + S[i]`` with ``tl.dot`` in full fp32
(``input_precision="ieee"``), storing every intermediate state.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _chain_scan_kernel(
    h0, t, s, out, n,
    HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):  # fmt: skip
    i_v = tl.program_id(0)
    i_h = tl.program_id(1).to(tl.int64)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_kv = m_k[:, None] & (o_v < V)[None, :]
    m_kk = m_k[:, None] & m_k[None, :]
    off_kv = o_k[:, None] * V + o_v[None, :]
    off_kk = o_k[:, None] * K + o_k[None, :]
    b_h = tl.load(h0 + i_h * K * V + off_kv, mask=m_kv, other=0.0).to(tl.float32)
    tl.store(out + i_h * K * V + off_kv, b_h, mask=m_kv)
    for i in range(n):
        base = i * HV + i_h
        b_t = tl.load(t + base * K * K + off_kk, mask=m_kk, other=0.0)
        b_s = tl.load(s + base * K * V + off_kv, mask=m_kv, other=0.0)
        b_h = tl.dot(b_t, b_h, input_precision="ieee") + b_s
        tl.store(out + (base + HV) * K * V + off_kv, b_h, mask=m_kv)


def chain_scan_triton(h0: torch.Tensor, T: torch.Tensor, S: torch.Tensor) -> torch.Tensor:
    """h0 ``[HV, K, V]``, T ``[n, HV, K, K]``, S ``[n, HV, K, V]`` (CUDA) -> ``[n+1, HV, K, V]`` fp32."""
    HV, K, V = h0.shape
    n = T.shape[0]
    h0, T, S = (x.float().contiguous() for x in (h0, T, S))
    out = torch.empty(n + 1, HV, K, V, dtype=torch.float32, device=h0.device)
    BK = max(16, triton.next_power_of_2(K))
    BV = max(16, min(64 if K <= 64 else 32, triton.next_power_of_2(V)))
    grid = (triton.cdiv(V, BV), HV)
    _chain_scan_kernel[grid](h0, T, S, out, n, HV=HV, K=K, V=V, BK=BK, BV=BV, num_warps=8 if BK >= 128 else 4)
    return out
