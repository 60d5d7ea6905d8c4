"""RMS norms used by the hybrid family."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """RMSNorm over the last dim.

    ``zero_centered=True`` (Qwen3.5 / Qwen3-Next): ``norm(x) * (1 + w)`` computed in fp32, weight init 0.
    ``zero_centered=False`` (Llama): ``w * norm(x).to(dtype)``, weight init 1.
    """

    def __init__(self, dim: int, eps: float, zero_centered: bool) -> None:
        super().__init__()
        self.eps = eps
        self.zero_centered = zero_centered
        self.weight = nn.Parameter(torch.zeros(dim) if zero_centered else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.zero_centered:
            return (y * (1.0 + self.weight.float())).type_as(x)
        return self.weight * y.to(x.dtype)


class GatedRMSNorm(nn.Module):
    """Gated RMSNorm of the GDN output: ``w * norm(x) * silu(z)`` (norm before gate), per head.

    x, z: ``[..., V]``.
    """

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        y = self.weight * y.to(dtype)
        return (y * F.silu(z.float())).to(dtype)
