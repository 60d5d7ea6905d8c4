"""State re-rotation in PyTorch (the only implementation of ``state_rope``; derivation there): the key
dim of a state ``[H, K, V]`` or a dense transition ``[H, K, K]`` rotated by ``R(offset)`` with
``rope.apply_rope``, in fp32.
"""

from __future__ import annotations

import torch

from ..rope import apply_rope


def _rotate_rows(x: torch.Tensor, offset: int, rotary_dim: int, theta: float) -> torch.Tensor:
    """``x [H, K, M]`` -> ``R(offset)`` applied to the K dim of every column (fp32)."""
    m = x.shape[2]
    cols = x.float().permute(2, 0, 1)  # [M, H, K]: each column a "token" at position offset
    pos = torch.full((m,), int(offset), dtype=torch.int64, device=x.device)
    return apply_rope(cols, pos, rotary_dim=rotary_dim, theta=theta).permute(1, 2, 0).contiguous()


def rotate_state(S: torch.Tensor, offset: int, *, rotary_dim: int, theta: float) -> torch.Tensor:
    """``S [H, K, V]`` built at local positions -> the state of the same tokens at ``offset + local``
    positions: ``R(offset) S`` (fp32)."""
    return _rotate_rows(S, offset, rotary_dim, theta)


def rotate_transition(T: torch.Tensor, offset: int, *, rotary_dim: int, theta: float) -> torch.Tensor:
    """A span's transition placed at ``offset``: a per-head decay ``T [H]`` is unchanged; a dense
    ``T [H, K, K]`` becomes ``R(offset) T R(offset)^T`` (fp32)."""
    if T.dim() == 1:
        return T.float()
    left = _rotate_rows(T, offset, rotary_dim, theta)  # R T
    return _rotate_rows(left.transpose(1, 2), offset, rotary_dim, theta).transpose(1, 2).contiguous()  # (R (R T)^T)^T
