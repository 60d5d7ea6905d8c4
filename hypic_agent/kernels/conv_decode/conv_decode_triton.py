"""In-place causal-conv decode step over a conv-state pool, in Triton (CUDA; imported lazily).
Twin: ``conv_decode_torch.conv_decode_slots_torch``.

One program per (row, block of BC channels): it reads the row's slot, the W-1 stored inputs of its
channels and the new input, writes ``y = act(bias + sum_j weight[:, j] window[j])`` (fp32 math,
window = stored inputs then x) and shifts x into the slot (``state[j] <- window[j + 1]``); each
program reads all its state columns before it stores any. Stored inputs are read through x's dtype,
as ``conv.causal_conv1d_step`` does. A negative slot (padding row) stores zeros to y and touches no
state. No host reads, grid from shapes only: CUDA-graph capturable.

Layouts: x ``[N, C]`` (rows may be strided); conv_pool ``[S, C, W-1]``, each slot contiguous;
slots ``[N]`` int32 / int64; weight ``[C, W]``; bias ``[C]`` or None.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

DEFAULT_BC = 256
DEFAULT_WARPS = 2


@triton.jit
def _conv_decode_kernel(
    x, pool, slots, w, b, y, s_xn, s_pool, s_slot, C,
    W: tl.constexpr, BC: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
):  # fmt: skip
    n = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BC + tl.arange(0, BC)
    m_c = cols < C
    slot = tl.load(slots + n * s_slot).to(tl.int64)
    live = slot >= 0
    m_s = m_c & live
    p_s = pool + tl.where(live, slot, 0) * s_pool + cols * (W - 1)
    xv = tl.load(x + n * s_xn + cols, mask=m_c, other=0.0)
    acc = tl.zeros([BC], tl.float32)
    for j in tl.static_range(W - 1):
        sj = tl.load(p_s + j, mask=m_s, other=0.0).to(xv.dtype)
        acc += sj.to(tl.float32) * tl.load(w + cols * W + j, mask=m_c, other=0.0).to(tl.float32)
        if j > 0:  # window[j] moves to state[j - 1]
            tl.store(p_s + (j - 1), sj.to(pool.dtype.element_ty), mask=m_s)
    acc += xv.to(tl.float32) * tl.load(w + cols * W + (W - 1), mask=m_c, other=0.0).to(tl.float32)
    if W > 1:
        tl.store(p_s + (W - 2), xv.to(pool.dtype.element_ty), mask=m_s)
    if HAS_BIAS:
        acc += tl.load(b + cols, mask=m_c, other=0.0).to(tl.float32)
    if SILU:
        acc = acc * tl.sigmoid(acc)
    acc = tl.where(live, acc, 0.0)
    tl.store(y + n * C + cols, acc.to(y.dtype.element_ty), mask=m_c)


def conv_decode_slots_triton(
    x: torch.Tensor,
    conv_pool: torch.Tensor,
    slots: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    silu: bool,
    *,
    bc: int = DEFAULT_BC,
    num_warps: int = DEFAULT_WARPS,
) -> torch.Tensor:
    """x ``[N, C]``, conv_pool ``[S, C, W-1]`` (updated in place), slots ``[N]``, weight ``[C, W]``,
    bias ``[C]`` or None -> y ``[N, C]`` in x's dtype (zeros on padding rows)."""
    N, C = x.shape
    W = weight.shape[-1]
    if tuple(conv_pool.stride()[1:]) != (W - 1, 1) and W > 1:
        raise ValueError(f"conv_pool must have contiguous slots [C, W-1], got strides {conv_pool.stride()}")
    x = x if x.stride(-1) == 1 else x.contiguous()
    weight = weight.contiguous()
    bias = None if bias is None else bias.contiguous()
    y = torch.empty(N, C, dtype=x.dtype, device=x.device)
    if N == 0:
        return y
    bc = min(bc, triton.next_power_of_2(C))
    _conv_decode_kernel[(N, triton.cdiv(C, bc))](
        x, conv_pool, slots, weight, bias if bias is not None else weight, y,
        x.stride(0), conv_pool.stride(0), slots.stride(0), C,
        W=W, BC=bc, HAS_BIAS=bias is not None, SILU=silu, num_warps=num_warps,
    )  # fmt: skip
    return y
