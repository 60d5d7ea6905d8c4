"""Gated DeltaNet gates: ``g = -exp(A_log) * softplus(a + dt_bias)`` (fp32 log-decay) and
``beta = sigmoid(b)``, per token and value head. One Triton launch on CUDA (``gdn_gates_triton``),
the torch twin elsewhere and wherever autograd needs it (``gdn_gates_torch``)."""

from __future__ import annotations

import torch

from ..backend import resolve_triton
from .gdn_gates_torch import gdn_gates_torch

__all__ = ["gdn_gates", "gdn_gates_torch"]


def gdn_gates(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, *, backend: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """a, b ``[T, HV]``, A_log, dt_bias ``[HV]`` -> (g ``[T, HV]`` fp32, beta ``[T, HV]`` in b's dtype)."""
    if a.dim() != 2 or a.shape != b.shape or A_log.shape != (a.shape[1],) or dt_bias.shape != (a.shape[1],):
        raise ValueError(
            f"need a, b [T, HV] and A_log, dt_bias [HV]; got {tuple(a.shape)}, {tuple(b.shape)}, "
            f"{tuple(A_log.shape)}, {tuple(dt_bias.shape)}"
        )
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (a, b, A_log, dt_bias))
    if not needs_grad and resolve_triton(backend, a.device):
        from .gdn_gates_triton import gdn_gates_triton

        return gdn_gates_triton(a, b, A_log, dt_bias)
    return gdn_gates_torch(a, b, A_log, dt_bias)
