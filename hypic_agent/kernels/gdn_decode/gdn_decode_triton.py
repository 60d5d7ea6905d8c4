"""In-place gated-delta-rule decode step over a state pool, in Triton (CUDA; imported lazily).
Twin: ``gdn_decode_torch.gdn_decode_slots_torch``.

One program per (row, value head, block of BV value columns): it reads the row's slot, keeps the
state tile ``S [K, BV]`` (fp32) of that slot and head in registers, runs the step and stores the
tile back where it came from. Per value head ``hv`` (key head ``hv // (HV // H)``)::

    S <- exp(g) S;   S <- S + k (beta (v - S^T k))^T;   o = S^T (scale q)

with q, k L2-normalised first when asked (``x / sqrt(sum x^2 + 1e-6)``). A negative slot (padding
row) stores zeros to ``o`` and loads / stores no state. No host reads; the grid comes from shapes
only, so a launch can be captured in a CUDA graph and replayed with other slots.

Layouts: q, k ``[N, H, K]``, v ``[N, HV, V]`` (rows and heads may be strided, the last dim
contiguous); g, beta ``[N, HV]``; state_pool ``[S, HV, K, V]`` fp32 with each slot contiguous;
slots ``[N]`` int32 / int64. K, V up to 256, any size (masked to the next power of two).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def default_launch(n_rows: int) -> tuple[int, int]:
    """``(BV, num_warps)`` measured best on the H200 at the Qwen3.5-35B-A3B shape (HV 32, K = V = 128;
    ``benchmarks/decode_kernels.py``): (16, 1) up to 16 rows (batch 1: 6.8 us, against 23 us at
    (8, 1)), (64, 2) above (batch 64: 76 us against 220 us; the state traffic's floor is 56 us)."""
    return (16, 1) if n_rows <= 16 else (64, 2)


@triton.jit
def _gdn_decode_kernel(
    q, k, v, g, beta, pool, slots, o,
    s_qn, s_qh, s_kn, s_kh, s_vn, s_vh, s_gn, s_gh, s_bn, s_bh, s_pool, s_slot,
    scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr,
):  # fmt: skip
    n = tl.program_id(0).to(tl.int64)
    hv = tl.program_id(1)
    h = hv // (HV // H)
    keys = tl.arange(0, BK)
    cols = tl.program_id(2) * BV + tl.arange(0, BV)
    m_k = keys < K
    m_v = cols < V
    slot = tl.load(slots + n * s_slot).to(tl.int64)
    live = slot >= 0

    bq = tl.load(q + n * s_qn + h * s_qh + keys, mask=m_k, other=0.0).to(tl.float32)
    bk = tl.load(k + n * s_kn + h * s_kh + keys, mask=m_k, other=0.0).to(tl.float32)
    if L2NORM:
        bq = bq / tl.sqrt(tl.sum(bq * bq) + 1e-6)
        bk = bk / tl.sqrt(tl.sum(bk * bk) + 1e-6)
    bq = bq * scale
    bv = tl.load(v + n * s_vn + hv * s_vh + cols, mask=m_v, other=0.0).to(tl.float32)
    bg = tl.load(g + n * s_gn + hv * s_gh).to(tl.float32)
    bb = tl.load(beta + n * s_bn + hv * s_bh).to(tl.float32)

    p_s = pool + tl.where(live, slot, 0) * s_pool + hv * (K * V) + keys[:, None] * V + cols[None, :]
    m_s = m_k[:, None] & m_v[None, :] & live
    s = tl.load(p_s, mask=m_s, other=0.0)
    s = s * tl.exp(bg)
    delta = (bv - tl.sum(s * bk[:, None], 0)) * bb
    s = s + bk[:, None] * delta[None, :]
    out = tl.where(live, tl.sum(s * bq[:, None], 0), 0.0)
    tl.store(o + (n * HV + hv) * V + cols, out.to(o.dtype.element_ty), mask=m_v)
    tl.store(p_s, s, mask=m_s)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x with a unit stride in its last dim (a copy only when it has none)."""
    return x if x.stride(-1) == 1 else x.contiguous()


def gdn_decode_slots_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state_pool: torch.Tensor,
    slots: torch.Tensor,
    use_qk_l2norm: bool,
    scale: float | None,
    *,
    bv: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """q, k ``[N, H, K]``; v ``[N, HV, V]``; g, beta ``[N, HV]``; state_pool ``[S, HV, K, V]`` fp32
    (updated in place); slots ``[N]`` -> o ``[N, HV, V]`` in q's dtype (zeros on padding rows)."""
    N, H, K = k.shape
    HV, V = v.shape[-2:]
    best_bv, best_warps = default_launch(N)
    bv, num_warps = bv or best_bv, num_warps or best_warps
    if tuple(state_pool.stride()[1:]) != (K * V, V, 1):
        raise ValueError(f"state_pool must have contiguous slots [HV, K, V], got strides {state_pool.stride()}")
    q, k, v = _rows(q), _rows(k), _rows(v)
    o = torch.empty(N, HV, V, dtype=q.dtype, device=q.device)
    if N == 0:
        return o
    bv = min(bv, triton.next_power_of_2(V))
    _gdn_decode_kernel[(N, HV, triton.cdiv(V, bv))](
        q, k, v, g, beta, state_pool, slots, o,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        g.stride(0), g.stride(1), beta.stride(0), beta.stride(1), state_pool.stride(0), slots.stride(0),
        K**-0.5 if scale is None else float(scale),
        H=H, HV=HV, K=K, V=V, BK=triton.next_power_of_2(K), BV=bv, L2NORM=use_qk_l2norm, num_warps=num_warps,
    )  # fmt: skip
    return o
