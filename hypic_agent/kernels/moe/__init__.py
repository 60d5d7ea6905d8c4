"""Mixture-of-experts FFN over routed tokens (SwiGLU experts, Qwen3.5-MoE / Qwen3-Next layout).

Weights: ``gate_up [E, 2I, D]`` (rows ``:I`` gate, ``I:`` up) and ``down [E, D, I]``. Token t's
output is ``sum_j topk_w[t, j] * down_e (silu(gate_e x_t) * up_e x_t)`` with ``e = topk_idx[t, j]``.
On CUDA few (token, slot) pairs (up to ``max_slots``: decode steps, a short question after cached
segments) run through ``moe_triton`` (two launches that stream the hit experts' weights); otherwise
the tokens are sorted by expert (``moe_torch``): on CUDA one ``torch._grouped_mm`` per projection
when available, else a loop over the experts hit (the CPU twin).
"""

from __future__ import annotations

import torch

from ..backend import triton_available
from ..config import DEFAULT_KERNELS
from .moe_torch import moe_experts_torch

__all__ = ["moe_experts", "moe_experts_torch"]


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
    use_grouped = backend != "torch" and x.is_cuda and hasattr(torch, "_grouped_mm") and gate_up.dtype == torch.bfloat16
    return moe_experts_torch(x, topk_idx, topk_w, gate_up, down, grouped=use_grouped)
