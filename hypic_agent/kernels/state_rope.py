"""State re-rotation: placing a cached linear-attention pair built at local positions at a global
offset, for linear layers that rotate their keys with RoPE (Ring-linear's Lightning, HYPIC §2).

Derivation. RoPE rotates each 2-D plane i of a key by the angle ``p * w_i``; rotations of one plane
commute and add, so ``R(P + p) = R(P) R(p)`` for the block-diagonal rotation R of the key dim. A
decay-only state is ``S = sum_j w_j k_j v_j^T`` (``[K, V]``, fla layout) with ``w_j`` scalars; with
keys rotated at their positions, a segment run at local positions ``0..n-1`` gives ``S_loc``, and
the same tokens at global positions ``P..P+n-1`` give ``S_glob = sum_j w_j R(P) R(j) k_j v_j^T
= R(P) S_loc``: the state's key dim rotated by P, column by column, exactly (no approximation).
The decay T is a scalar per head and does not change. For a transition that mixes key channels
(a delta rule, ``T = prod (a_t I - b_t k_t k_t^T)``), the same argument gives
``T_glob = R(P) T_loc R(P)^T``. Queries rotated at global positions then read ``q^T R(p) S``
consistently. So ``S(prefix . C) = T_C * S(prefix) + R(P) S_loc(C)``; skipping the rotation leaves
every cached key at the wrong angle for all later queries.

``rotate_state`` / ``rotate_transition`` do this with ``kernels.rope.apply_rope`` (rotate-half /
NeoX convention, the first ``rotary_dim`` key dims; the rest pass through).
"""

from __future__ import annotations

import torch

from hypic_agent.kernels.rope import apply_rope


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
