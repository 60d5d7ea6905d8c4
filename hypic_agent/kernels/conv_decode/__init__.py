"""Causal depthwise conv decode step for N running requests whose conv states live in a pool.

``conv_pool [S, C, W-1]`` (model dtype) holds one linear layer's conv states, one slot per request:
the last W-1 *inputs*, oldest first (as in ``conv``). A step reads ``conv_pool[slots]``, writes
``y = act(bias + sum_j weight[:, j] window[j])`` (window = the stored inputs then x) and shifts x
into the slot, in place. Same math as ``conv.causal_conv1d_step``.

On CUDA: the project's Triton kernel (``conv_decode_triton``): one launch, no host reads, grid
from shapes only (CUDA-graph capturable). fla-core's conv works on its own ``[N, C, W]`` state
layout per sequence (``conv_fla``), not on slots of our ``[S, C, W-1]`` pool, so using it would
cost a gather and a scatter per step. Elsewhere (and with ``backend="torch"``) the twin
``conv_decode_torch`` runs; it reads the slots on the host, so it is not capturable.
"""

from __future__ import annotations

import torch

from ..backend import resolve_triton
from .conv_decode_torch import conv_decode_slots_torch

__all__ = ["conv_decode_slots", "conv_decode_slots_torch"]

_ACTS = (None, "silu", "swish", "identity")


def conv_decode_slots(
    x: torch.Tensor,
    conv_pool: torch.Tensor,
    slots: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    activation: str | None = "silu",
    backend: str = "auto",
) -> torch.Tensor:
    """One conv decode step of N rows, each against its slot of the pool, updated in place.

    Args:
        x: ``[N, C]`` the new inputs; weight: ``[C, W]``; bias: ``[C]`` or None.
        conv_pool: ``[S, C, W-1]``, each slot contiguous; ``conv_pool[slots[i]]`` is row i's state and
            is overwritten with the shifted one. Other slots are not touched.
        slots: ``[N]`` int32 / int64; a negative slot marks a padding row (output zeros, no state
            written). The live rows' slots must be distinct and ``< S`` (not checked: no host reads).
        activation: ``"silu"`` / ``"swish"`` or ``None`` / ``"identity"``.
    Returns:
        y ``[N, C]`` in x's dtype.
    """
    if x.dim() != 2:
        raise ValueError(f"x must be [N, C], got {tuple(x.shape)}")
    N, C = x.shape
    if weight.dim() != 2 or weight.shape[0] != C:
        raise ValueError(f"weight must be [C, W] with C={C}, got {tuple(weight.shape)}")
    W = weight.shape[1]
    if conv_pool.dim() != 3 or tuple(conv_pool.shape[1:]) != (C, W - 1):
        raise ValueError(f"conv_pool must be [S, C, W-1] = [S, {C}, {W - 1}], got {tuple(conv_pool.shape)}")
    if bias is not None and bias.shape != (C,):
        raise ValueError(f"bias must be [C] = [{C}], got {tuple(bias.shape)}")
    if slots.shape != (N,) or slots.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"slots must be [N] = [{N}] int32 / int64, got {tuple(slots.shape)} {slots.dtype}")
    if activation not in _ACTS:
        raise ValueError(f"unknown conv activation {activation!r}; use one of {_ACTS}")
    if resolve_triton(backend, x.device):
        from .conv_decode_triton import conv_decode_slots_triton

        return conv_decode_slots_triton(x, conv_pool, slots, weight, bias, activation in ("silu", "swish"))
    return conv_decode_slots_torch(x, conv_pool, slots, weight, bias, activation)
