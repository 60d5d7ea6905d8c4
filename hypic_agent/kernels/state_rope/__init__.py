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

``rotate_state`` (``S [H, K, V]``) / ``rotate_transition`` (``T [H]`` or ``[H, K, K]``) do this with
``kernels.rope.apply_rope`` (rotate-half / NeoX convention, the first ``rotary_dim`` key dims; the
rest pass through), in plain PyTorch on every device (``state_rope_torch``).
"""

from __future__ import annotations

from .state_rope_torch import rotate_state, rotate_transition

__all__ = ["rotate_state", "rotate_transition"]
