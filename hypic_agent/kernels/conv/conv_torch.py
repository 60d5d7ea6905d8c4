"""Plain-PyTorch conv: the twin of ``conv.causal_conv1d`` (the reference; ``conv_triton`` / ``conv_fla``
on CUDA) and the decode step behind ``conv.causal_conv1d_step`` (torch on every device).

Layouts as in ``conv``: x ``[T, C]``, weight ``[C, W]``, bias ``[C]`` or None, conv state
``[N, C, W-1]`` (the last W-1 inputs, oldest first).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .._varlen import seq_ids

ACTS = (None, "silu", "swish", "identity")


def activate(y: torch.Tensor, activation: str | None) -> torch.Tensor:
    """``silu`` / ``swish`` or identity (None, ``"identity"``); any other name is a ValueError."""
    if activation not in ACTS:
        raise ValueError(f"unknown conv activation {activation!r}; use one of {ACTS}")
    return F.silu(y) if activation in ("silu", "swish") else y


def causal_conv1d_torch(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    cu: torch.Tensor,
    initial_state: torch.Tensor | None,
    activation: str | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x ``[T, C]``, weight ``[C, W]``, cu ``[N+1]``, state ``[N, C, W-1]`` or None -> (y ``[T, C]``,
    final ``[N, C, W-1]``), both in x's dtype, computed in fp32 over an extended buffer."""
    T, C = x.shape
    W = weight.shape[-1]
    n = cu.numel() - 1
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
    return activate(y, activation).to(x.dtype), final.to(x.dtype).contiguous()


def causal_conv1d_step_torch(
    x: torch.Tensor,
    state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x ``[N, C]``, state ``[N, C, W-1]``, weight ``[C, W]`` -> (y ``[N, C]``, new state ``[N, C, W-1]``)."""
    window = torch.cat([state.to(x.dtype), x[:, :, None]], dim=-1)  # [N, C, W]
    y = (window.float() * weight.float()).sum(-1)
    if bias is not None:
        y = y + bias.float()
    return activate(y, activation).to(x.dtype), window[..., 1:].contiguous()
