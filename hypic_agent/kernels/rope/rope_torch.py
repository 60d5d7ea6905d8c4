"""Rotary position embedding in PyTorch (rotate-half / NeoX style; the only implementation of ``rope``):
cos / sin tables, cached for recent position tensors, and the rotation of the first ``rotary_dim``
dims of ``x [T, H, D]``.
"""

from __future__ import annotations

import collections

import torch

# cos / sin tables of recent position tensors, matched by identity: every attention layer of a
# forward rotates at the same positions tensor, so the tables are built once per forward, not per
# layer (9 small ops each). Position tensors are never modified in place.
_TABLES: collections.deque[tuple[torch.Tensor, int, float, torch.device, tuple[torch.Tensor, torch.Tensor]]] = (
    collections.deque(maxlen=8)
)


def rope_cos_sin(
    positions: torch.Tensor, rotary_dim: int, theta: float, device: torch.device | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin ``[T, rotary_dim]`` fp32 for ``positions [T]`` (halves repeated: ``cat(f, f)``)."""
    if rotary_dim % 2:
        raise ValueError(f"rotary_dim must be even, got {rotary_dim}")
    dev = device if device is not None else positions.device
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64, device=dev).float() / rotary_dim))
    freqs = positions.to(dev).float()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def _cached_cos_sin(
    positions: torch.Tensor, rotary_dim: int, theta: float, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    for pos, rd, th, dev, tables in _TABLES:
        if pos is positions and rd == rotary_dim and th == theta and dev == device:
            return tables
    tables = rope_cos_sin(positions, rotary_dim, theta, device)
    _TABLES.append((positions, rotary_dim, theta, device, tables))
    return tables


def apply_rope_torch(x: torch.Tensor, positions: torch.Tensor, rotary_dim: int, theta: float) -> torch.Tensor:
    """Rotate ``x [T, H, D]`` at ``positions [T]``; dims ``>= rotary_dim`` pass through. fp32 math, x's dtype."""
    D = x.shape[-1]
    cos, sin = _cached_cos_sin(positions, rotary_dim, theta, x.device)
    cos, sin = cos[:, None, :], sin[:, None, :]
    xr = x[..., :rotary_dim].float()
    half = rotary_dim // 2
    rot = torch.cat([-xr[..., half:], xr[..., :half]], dim=-1)
    out = (xr * cos + rot * sin).to(x.dtype)
    if rotary_dim == D:
        return out
    return torch.cat([out, x[..., rotary_dim:]], dim=-1)
