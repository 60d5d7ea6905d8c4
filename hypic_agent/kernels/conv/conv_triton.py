"""Varlen causal depthwise conv for short forwards, in Triton (CUDA; imported lazily).
Twin: ``conv_torch.causal_conv1d_torch``.

fla's conv is built for long prefills; at a few hundred tokens (combine's seam windows, prefix
continuation) its Python launch path costs more than the GPU work. This is two plain launches:
the output, with each token finding its sequence by counting ``cu_seqlens`` bounds and reading
inputs before its sequence start from the initial state, and the final states.

Layouts as in ``conv``: x ``[T, C]``, weight ``[C, W]``, state ``[N, C, W-1]`` (oldest first).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _conv_fwd_kernel(
    x, w, b, cu, h0, y, N, T, C,
    W: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, HAS_INIT: tl.constexpr, HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BT + tl.arange(0, BT)
    cols = tl.program_id(1) * BC + tl.arange(0, BC)
    m_t = rows < T
    m_c = cols < C
    seq = tl.zeros([BT], tl.int64)
    for i in range(1, N):  # sequence of each token: how many later starts it has passed
        seq += (rows >= tl.load(cu + i)).to(tl.int64)
    start = tl.load(cu + seq, mask=m_t, other=0).to(tl.int64)
    acc = tl.zeros([BT, BC], tl.float32)
    if HAS_BIAS:
        acc += tl.load(b + cols, mask=m_c, other=0.0).to(tl.float32)[None, :]
    for j in tl.static_range(W):
        src = rows - (W - 1) + j
        inside = src >= start
        w_j = tl.load(w + cols * W + j, mask=m_c, other=0.0).to(tl.float32)
        xv = tl.load(x + src[:, None] * C + cols[None, :], mask=(m_t & inside)[:, None] & m_c[None, :], other=0.0)
        xv = xv.to(tl.float32)
        if HAS_INIT:  # inputs before the sequence start: its state, index src - start + W - 1
            hv = tl.load(h0 + (seq[:, None] * C + cols[None, :]) * (W - 1) + (src - start + W - 1)[:, None],
                         mask=(m_t & ~inside)[:, None] & m_c[None, :], other=0.0)  # fmt: skip
            xv = tl.where(inside[:, None], xv, hv.to(tl.float32))
        acc += xv * w_j[None, :]
    if SILU:
        acc = acc * tl.sigmoid(acc)
    tl.store(y + rows[:, None] * C + cols[None, :], acc.to(y.dtype.element_ty), mask=m_t[:, None] & m_c[None, :])


@triton.jit
def _conv_final_kernel(x, cu, h0, ht, C, W: tl.constexpr, BC: tl.constexpr, HAS_INIT: tl.constexpr):
    """Per sequence: its last W-1 inputs (from the state where the sequence is shorter)."""
    n = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BC + tl.arange(0, BC)
    m_c = cols < C
    start = tl.load(cu + n).to(tl.int64)
    end = tl.load(cu + n + 1).to(tl.int64)
    for i in tl.static_range(W - 1):
        pos = end - (W - 1) + i
        val = tl.load(x + pos * C + cols, mask=m_c & (pos >= start), other=0.0)
        if HAS_INIT:
            hv = tl.load(h0 + (n * C + cols) * (W - 1) + (pos - start + W - 1), mask=m_c & (pos < start), other=0.0)
            val = tl.where(pos >= start, val, hv.to(val.dtype))
        tl.store(ht + (n * C + cols) * (W - 1) + i, val.to(ht.dtype.element_ty), mask=m_c)


def causal_conv1d_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    cu_seqlens: torch.Tensor,
    initial_state: torch.Tensor | None,
    silu: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x ``[T, C]``, weight ``[C, W]``, bias ``[C]`` or None, cu_seqlens ``[N+1]`` (on x's device),
    state ``[N, C, W-1]`` or None -> (y ``[T, C]``, final ``[N, C, W-1]``), both in x's dtype."""
    T, C = x.shape
    W = weight.shape[-1]
    n = cu_seqlens.numel() - 1
    x, weight = x.contiguous(), weight.contiguous()
    h0 = None if initial_state is None else initial_state.contiguous()
    y = torch.empty_like(x)
    final = torch.empty(n, C, W - 1, dtype=x.dtype, device=x.device)
    BT, BC = 16, 128
    if T:
        _conv_fwd_kernel[(triton.cdiv(T, BT), triton.cdiv(C, BC))](
            x, weight, bias if bias is not None else x, cu_seqlens, h0 if h0 is not None else x, y, n, T, C,
            W=W, BT=BT, BC=BC, HAS_INIT=h0 is not None, HAS_BIAS=bias is not None, SILU=silu, num_warps=4,
        )  # fmt: skip
    if n and W > 1:
        _conv_final_kernel[(n, triton.cdiv(C, BC))](
            x, cu_seqlens, h0 if h0 is not None else x, final, C, W=W, BC=BC, HAS_INIT=h0 is not None, num_warps=4
        )
    return y, final
