"""Torch twin of ``gdn_gates_triton``: the Gated DeltaNet gates of T tokens."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gdn_gates_torch(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """a, b ``[T, HV]``, A_log, dt_bias ``[HV]`` -> (g ``[T, HV]`` fp32 log-decay
    ``-exp(A_log) * softplus(a + dt_bias)``, beta ``[T, HV]`` = ``sigmoid(b)`` in b's dtype)."""
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    return g, b.sigmoid()
