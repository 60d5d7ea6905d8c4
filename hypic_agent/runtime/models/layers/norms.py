"""RMS norms used by the hybrid family (the math lives in ``hypic_agent.kernels.norm``)."""

from __future__ import annotations

import torch
from torch import nn

from hypic_agent.kernels import norm as norm_ops
from hypic_agent.kernels.config import DEFAULT_KERNELS, KernelConfig


class RMSNorm(nn.Module):
    """RMSNorm over the last dim.

    ``zero_centered=True`` (Qwen3.5 / Qwen3-Next): ``norm(x) * (1 + w)`` computed in fp32, weight init 0.
    ``zero_centered=False`` (Llama): ``w * norm(x).to(dtype)``, weight init 1.
    ``backend`` (``auto`` | ``torch`` | ``fla``): ``auto`` is torch on CPU, the fused fla kernel on
    CUDA when autograd is not needed. ``kernels``: the kernel choices (``norm_fla_min_rows``), set
    with ``HybridForCausalLM.set_kernels``.
    """

    def __init__(self, dim: int, eps: float, zero_centered: bool) -> None:
        super().__init__()
        self.eps = eps
        self.zero_centered = zero_centered
        self.backend = "auto"
        self.kernels: KernelConfig = DEFAULT_KERNELS
        self.weight = nn.Parameter(torch.zeros(dim) if zero_centered else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., dim]`` -> ``[..., dim]``."""
        return norm_ops.rms_norm(
            x, self.weight, self.eps, zero_centered=self.zero_centered, backend=self.backend,
            min_rows=self.kernels.norm_fla_min_rows,
        )  # fmt: skip


class GatedRMSNorm(nn.Module):
    """Gated RMSNorm of the GDN output: ``w * norm(x) * silu(z)`` (norm before gate), per head.

    x, z: ``[..., V]``. ``backend`` and ``kernels`` as in ``RMSNorm``.
    """

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.backend = "auto"
        self.kernels: KernelConfig = DEFAULT_KERNELS
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return norm_ops.gated_rms_norm(
            x, z, self.weight, self.eps, backend=self.backend, min_rows=self.kernels.norm_fla_min_rows
        )
