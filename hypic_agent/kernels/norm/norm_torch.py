"""Plain-PyTorch twins of ``norm.rms_norm`` / ``norm.gated_rms_norm`` (the references; ``norm_fla`` on CUDA
in inference). Layouts: x, z ``[..., D]``, weight ``[D]``; conventions in ``norm``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered: bool) -> torch.Tensor:
    """Reference: x ``[..., D]``, weight ``[D]`` -> ``[..., D]``."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if zero_centered:
        return (y * (1.0 + weight.float())).type_as(x)
    return weight * y.to(x.dtype)


def gated_rms_norm_torch(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Reference: x, z ``[..., D]``, weight ``[D]`` -> ``[..., D]`` in x's dtype."""
    dtype = x.dtype
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    y = weight * y.to(dtype)
    return (y * F.silu(z.float())).to(dtype)
