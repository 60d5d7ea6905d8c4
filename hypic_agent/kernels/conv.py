"""Causal depthwise short convolution (the q/k/v conv of GDN layers), varlen with carried state.

Layouts: x ``[T, C]`` packed tokens, weight ``[C, W]``, bias ``[C]`` or None, conv state
``[N, C, W-1]`` = the last W-1 *inputs* of each sequence (oldest first). Output token t of a
sequence is ``act(bias + sum_j weight[:, j] * x_{t-W+1+j})`` where inputs before the sequence
start come from its initial state (zeros when none).

On CUDA: up to ``SHORT_TOKENS`` tokens the project's Triton kernel (``conv_triton``: two plain
launches), longer inputs fla-core's conv.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._varlen import normalize_cu_seqlens, seq_ids
from .backend import resolve_backend

_ACTS = (None, "silu", "swish", "identity")
SHORT_TOKENS = 2048


def _act(y: torch.Tensor, activation: str | None) -> torch.Tensor:
    if activation not in _ACTS:
        raise ValueError(f"unknown conv activation {activation!r}; use one of {_ACTS}")
    return F.silu(y) if activation in ("silu", "swish") else y


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
    _act(x[:0], activation)  # validate the name early
    if resolve_backend(backend, x.device) == "fla":
        if T <= SHORT_TOKENS:
            from .conv_triton import causal_conv1d_triton

            return causal_conv1d_triton(x, weight, bias, cu, initial_state, activation in ("silu", "swish"))
        from .conv_fla import causal_conv1d_fla

        return causal_conv1d_fla(x, weight, bias, cu, initial_state, activation)
    # extended buffer: each sequence preceded by its W-1 state inputs
    h0 = initial_state if initial_state is not None else x.new_zeros(n, C, W - 1)
    seq = seq_ids(cu, T)
    pos_tok = torch.arange(T, device=x.device) + (seq + 1) * (W - 1)  # where token t lands
    pos_st = (cu[:-1].long() + torch.arange(n, device=x.device) * (W - 1)).view(n, 1) + torch.arange(
        W - 1, device=x.device
    )  # [N, W-1]
    ext = x.new_zeros(T + n * (W - 1), C, dtype=torch.float32)
    ext[pos_tok] = x.float()
    ext[pos_st.reshape(-1)] = h0.float().transpose(1, 2).reshape(-1, C)
    wf = weight.float()
    y = ext[pos_tok] * wf[:, W - 1]
    for j in range(W - 1):
        y = y + ext[pos_tok - (W - 1) + j] * wf[:, j]
    if bias is not None:
        y = y + bias.float()
    ends = cu[1:].long() + torch.arange(1, n + 1, device=x.device) * (W - 1)  # [N] exclusive ends
    tail = ends.view(n, 1) - (W - 1) + torch.arange(W - 1, device=x.device)  # [N, W-1]
    final = ext[tail.reshape(-1)].view(n, W - 1, C).transpose(1, 2)
    return _act(y, activation).to(x.dtype), final.to(x.dtype).contiguous()


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
    window = torch.cat([state.to(x.dtype), x[:, :, None]], dim=-1)  # [N, C, W]
    y = (window.float() * weight.float()).sum(-1)
    if bias is not None:
        y = y + bias.float()
    return _act(y, activation).to(x.dtype), window[..., 1:].contiguous()
