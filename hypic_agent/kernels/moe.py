"""Mixture-of-experts FFN over routed tokens (SwiGLU experts, Qwen3.5-MoE / Qwen3-Next layout).

Weights: ``gate_up [E, 2I, D]`` (rows ``:I`` gate, ``I:`` up) and ``down [E, D, I]``. Token t's
output is ``sum_j topk_w[t, j] * down_e (silu(gate_e x_t) * up_e x_t)`` with ``e = topk_idx[t, j]``.
Tokens are sorted by expert; on CUDA few (token, slot) pairs (up to ``max_slots``: decode
steps, a short question after cached segments) run through ``moe_triton`` (two launches that
stream the hit experts' weights), more as one ``torch._grouped_mm`` per projection when available.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .backend import triton_available
from .config import DEFAULT_KERNELS


def _sorted(topk_idx: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Flattened (token, slot) pairs sorted by expert: order ``[T*k]``, token ``[T*k]``, counts ``[E]``."""
    flat = topk_idx.reshape(-1)
    order = torch.argsort(flat, stable=True)
    token = order // topk_idx.shape[1]
    if flat.is_cuda:  # bincount reads max(flat) back to the host; a scatter-add does not
        counts = torch.zeros(num_experts, dtype=torch.long, device=flat.device)
        counts.scatter_add_(0, flat, torch.ones_like(flat))
    else:
        counts = torch.bincount(flat, minlength=num_experts)
    return order, token, counts


def _loop(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """x ``[M, D]`` sorted by expert -> ``[M, D]`` (one matmul pair per expert hit)."""
    out = x.new_empty(x.shape[0], down.shape[1])
    start = 0
    for e, c in enumerate(counts):
        if c == 0:
            continue
        xs = x[start : start + c]
        gate, up = F.linear(xs, gate_up[e]).chunk(2, dim=-1)
        out[start : start + c] = F.linear(F.silu(gate) * up, down[e])
        start += c
    return out


def _grouped(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Same as ``_loop`` with ``torch._grouped_mm`` (CUDA, bf16)."""
    offs = counts.cumsum(0).to(torch.int32)
    h = torch._grouped_mm(x, gate_up.transpose(1, 2), offs=offs)
    gate, up = h.chunk(2, dim=-1)
    return torch._grouped_mm(F.silu(gate) * up, down.transpose(1, 2), offs=offs)


def moe_experts(
    x: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_w: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    *,
    backend: str = "auto",
    max_slots: int = DEFAULT_KERNELS.moe_triton_max_slots,
    block_m: int | None = DEFAULT_KERNELS.moe_triton_block_m,
) -> torch.Tensor:
    """Routed expert FFN.

    Args:
        x: ``[T, D]``; topk_idx: ``[T, k]`` int; topk_w: ``[T, k]`` routing weights.
        gate_up: ``[E, 2I, D]``; down: ``[E, D, I]``.
        max_slots: (token, slot) pairs up to which CUDA runs the Triton kernels, above it the
            grouped GEMM (``KernelConfig.moe_triton_max_slots``, where the measurements are).
        block_m: rows per block of the Triton kernels; None: their default
            (``KernelConfig.moe_triton_block_m``).
    Returns:
        ``[T, D]`` in x's dtype.
    """
    T, D = x.shape
    E = gate_up.shape[0]
    if gate_up.shape[2] != D or down.shape[:2] != (E, D) or down.shape[2] * 2 != gate_up.shape[1]:
        raise ValueError(
            f"need gate_up [E, 2I, D] and down [E, D, I] with D={D}; got {tuple(gate_up.shape)}, {tuple(down.shape)}"
        )
    if T == 0:
        return x.new_zeros(0, D)
    few = topk_idx.numel() <= max_slots and gate_up.dtype in (torch.bfloat16, torch.float16)
    if backend != "torch" and x.is_cuda and few and triton_available():
        from .moe_triton import moe_experts_triton

        extra = {} if block_m is None else {"block_m": block_m}
        return moe_experts_triton(x.to(gate_up.dtype), topk_idx, topk_w, gate_up, down, **extra).to(x.dtype)
    order, token, counts = _sorted(topk_idx, E)
    xs = x[token].to(gate_up.dtype)
    use_grouped = backend != "torch" and x.is_cuda and hasattr(torch, "_grouped_mm") and gate_up.dtype == torch.bfloat16
    if use_grouped:
        ys = _grouped(xs, gate_up, down, counts)
    else:
        ys = _loop(xs, gate_up, down, counts.tolist())
    # NOTE: un-sort with a gather and sum over the k slots: no atomics (index_add_ cost 1.1 ms per
    # layer at 8k tokens on an H200), deterministic, and the same arithmetic as transformers.
    inv = torch.empty_like(order)
    inv[order] = torch.arange(order.numel(), device=order.device)
    y = ys[inv].view(T, topk_idx.shape[1], D) * topk_w[..., None].to(ys.dtype)
    return y.sum(dim=1).to(x.dtype)
