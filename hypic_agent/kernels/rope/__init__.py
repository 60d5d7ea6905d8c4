"""Rotary position embedding, rotate-half (NeoX) style on the first ``rotary_dim`` dims.

Matches transformers' ``apply_rotary_pos_emb`` for llama and (text positions) Qwen3.5/Qwen3-Next,
whose interleaved M-RoPE reduces to this when its three position streams are equal. Rotation is
additive in position: ``apply_rope(apply_rope(x, p), d) == apply_rope(x, p + d)``, which is how
cached (un-rotated) keys are placed at any global offset.

Layouts: x ``[T, H, D]``, positions ``[T]`` int64; cos / sin tables ``[T, rotary_dim]`` fp32. One
implementation on every device (``rope_torch``: a few fused elementwise kernels).
"""

from __future__ import annotations

import torch

from .rope_torch import apply_rope_torch, rope_cos_sin

__all__ = ["apply_rope", "apply_rope_torch", "rope_cos_sin"]


def apply_rope(
    x: torch.Tensor,
    positions: torch.Tensor,
    *,
    rotary_dim: int,
    theta: float,
    backend: str = "auto",
) -> torch.Tensor:
    """Rotate ``x [T, H, D]`` at ``positions [T]`` (int64); dims ``>= rotary_dim`` pass through.

    Computed in fp32, returned in x's dtype. ``backend`` is accepted for interface symmetry; the
    op is a few fused elementwise kernels on any device.
    """
    del backend
    T, _, D = x.shape
    if positions.shape != (T,):
        raise ValueError(f"positions must be [T] = [{T}], got {tuple(positions.shape)}")
    if not 0 < rotary_dim <= D:
        raise ValueError(f"rotary_dim must be in (0, D={D}], got {rotary_dim}")
    return apply_rope_torch(x, positions, rotary_dim, theta)
