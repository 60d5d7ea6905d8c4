"""fla-core twins of ``norm_torch`` (CUDA inference; imported lazily by ``norm``, which falls back on failure).

fla's ``rms_norm`` / ``rms_norm_gated`` (fla-core 0.6: ``fla.modules.norm.layernorm`` and
``fla.modules.norm.fused_norm_gate``) flatten x to ``[N, D]``, load x, z and the weight as fp32,
compute ``x * rstd * w`` (gated: ``* z * sigmoid(z)``, norm before gate) in fp32 and store once in
x's dtype, in one Triton kernel. They are autograd Functions; called under ``no_grad`` they record
nothing. ``residual`` / ``prenorm`` / ``residual_in_fp32`` (fused residual add, returning the
pre-norm sum) and ``bias`` are left off.
"""

from __future__ import annotations

import torch

try:
    from fla.modules.norm.fused_norm_gate import rms_norm_gated as _fla_rms_norm_gated
    from fla.modules.norm.layernorm import rms_norm as _fla_rms_norm
except ImportError:  # layout before fla-core 0.6 (0.6 keeps these names as aliases)
    from fla.modules.fused_norm_gate import rms_norm_gated as _fla_rms_norm_gated
    from fla.modules.layernorm import rms_norm as _fla_rms_norm


def rms_norm_fla(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x * rsqrt(mean(x^2) + eps) * weight`` in fp32, stored in x's dtype.

    x ``[..., D]`` (CUDA), weight ``[D]`` (any float dtype; read as fp32) -> ``[..., D]``.
    """
    return _fla_rms_norm(x, weight, None, eps=eps)


def gated_rms_norm_fla(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x * rsqrt(mean(x^2) + eps) * weight * silu(z)`` in fp32, stored in x's dtype.

    x, z ``[..., D]`` (CUDA, same shape), weight ``[D]`` -> ``[..., D]``.
    """
    return _fla_rms_norm_gated(x, z, weight, None, activation="silu", eps=eps)
