"""Causal depthwise short convolution (the q/k/v conv of GDN layers), varlen with carried state.

Layouts: x ``[T, C]`` packed tokens, weight ``[C, W]``, bias ``[C]`` or None, conv state
``[N, C, W-1]`` = the last W-1 *inputs* of each sequence (oldest first). Output token t of a
sequence is ``act(bias + sum_j weight[:, j] * x_{t-W+1+j})`` where inputs before the sequence
start come from its initial state (zeros when none).

On CUDA: up to ``SHORT_TOKENS`` tokens the project's Triton kernel (``conv_triton``: two plain
launches), longer inputs fla-core's conv (``conv_fla``); elsewhere the plain-PyTorch twin
(``conv_torch``). The decode step is torch on every device (the pooled one is ``conv_decode``).
"""

from __future__ import annotations

import torch

from .._varlen import normalize_cu_seqlens
from ..backend import resolve_backend
from .conv_torch import activate, causal_conv1d_step_torch, causal_conv1d_torch

__all__ = ["SHORT_TOKENS", "causal_conv1d", "causal_conv1d_step", "causal_conv1d_step_torch", "causal_conv1d_torch"]

SHORT_TOKENS = 2048


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    cu_seqlens: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    activation: str | None = "silu",
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal depthwise conv over packed sequences.

    Args:
        x: ``[T, C]``; weight: ``[C, W]``; bias: ``[C]`` or None.
        cu_seqlens: ``[N+1]`` int32 (None = one sequence); initial_state: ``[N, C, W-1]`` or None.
    Returns:
        y ``[T, C]`` (x's dtype) and final_state ``[N, C, W-1]`` (x's dtype).
    """
    T, C = x.shape
    W = weight.shape[-1]
    if weight.shape != (C, W):
        raise ValueError(f"weight must be [C, W] with C={C}, got {tuple(weight.shape)}")
    cu = normalize_cu_seqlens(cu_seqlens, T, x.device)
    n = cu.numel() - 1
    if initial_state is not None and tuple(initial_state.shape) != (n, C, W - 1):
        raise ValueError(f"initial_state must be [N, C, W-1] = {(n, C, W - 1)}, got {tuple(initial_state.shape)}")
    activate(x[:0], activation)  # validate the name early
    if resolve_backend(backend, x.device) == "fla":
        if T <= SHORT_TOKENS:
            from .conv_triton import causal_conv1d_triton

            return causal_conv1d_triton(x, weight, bias, cu, initial_state, activation in ("silu", "swish"))
        from .conv_fla import causal_conv1d_fla

        return causal_conv1d_fla(x, weight, bias, cu, initial_state, activation)
    return causal_conv1d_torch(x, weight, bias, cu, initial_state, activation)


def causal_conv1d_step(
    x: torch.Tensor,
    state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = "silu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step for N sequences: x ``[N, C]``, state ``[N, C, W-1]``, weight ``[C, W]``.

    Returns y ``[N, C]`` and the new state ``[N, C, W-1]`` (new tensor, input untouched).
    """
    W = weight.shape[-1]
    if state.shape != (x.shape[0], x.shape[1], W - 1):
        raise ValueError(f"state must be [N, C, W-1] = {(x.shape[0], x.shape[1], W - 1)}, got {tuple(state.shape)}")
    return causal_conv1d_step_torch(x, state, weight, bias, activation)
