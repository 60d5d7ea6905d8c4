"""Gated-delta-rule decode step for N running requests whose states live in a preallocated pool.

``state_pool [S, HV, K, V]`` fp32 holds one linear layer's states, one slot per request; a step
reads and updates ``state_pool[slots]`` in place (no gather / scatter copies of ``[HV, K, V]``
states). Same math and conventions as ``gdn.gated_delta_rule_step`` (keys -> values state, GVA
key head ``hv // (HV // H)``, optional q/k L2 norm, scale default ``K ** -0.5``).

On CUDA: the project's Triton kernel (``gdn_decode_triton``): one launch, no host reads, grid from
shapes only, so it can be captured in a CUDA graph and replayed with new slots. fla-core 0.6.0's
``fused_recurrent_gated_delta_rule`` cannot serve here: it reads ``initial_state[i]`` for row i and
writes a new ``final_state`` tensor, with no slot index and no in-place store (an unknown keyword
such as ``ssm_state_indices`` vanishes into its ``**kwargs``), so using it would cost a gather and
a scatter of the states per step. fla 0.6.0's pool-indexed recurrences (``fla.ops.kda``,
``fla.ops.gdn2``) are other ops and do not skip negative (padding) indices.

Elsewhere (and with ``backend="torch"``) the twin ``gdn_decode_torch`` runs; it reads the slots on
the host, so it is not capturable.
"""

from __future__ import annotations

import torch

from ..backend import resolve_triton
from .gdn_decode_torch import gdn_decode_slots_torch

__all__ = ["gdn_decode_slots", "gdn_decode_slots_torch"]


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
           state_pool: torch.Tensor, slots: torch.Tensor) -> None:  # fmt: skip
    if q.dim() != 3 or q.shape != k.shape or v.dim() != 3 or v.shape[0] != q.shape[0]:
        raise ValueError(
            f"need q, k [N, H, K] and v [N, HV, V]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    N, H, K = k.shape
    HV, V = v.shape[1:]
    if HV % H:
        raise ValueError(f"HV ({HV}) must be a multiple of H ({H})")
    if g.shape != (N, HV) or beta.shape != (N, HV):
        raise ValueError(f"g and beta must be [N, HV] = {(N, HV)}, got {tuple(g.shape)} and {tuple(beta.shape)}")
    if state_pool.dim() != 4 or tuple(state_pool.shape[1:]) != (HV, K, V) or state_pool.dtype != torch.float32:
        raise ValueError(
            f"state_pool must be [S, HV, K, V] = [S, {HV}, {K}, {V}] fp32, "
            f"got {tuple(state_pool.shape)} {state_pool.dtype}"
        )
    if slots.shape != (N,) or slots.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"slots must be [N] = [{N}] int32 / int64, got {tuple(slots.shape)} {slots.dtype}")
    if len({t.device for t in (q, k, v, g, beta, state_pool, slots)}) != 1:
        raise ValueError("q, k, v, g, beta, state_pool and slots must be on one device")


def gdn_decode_slots(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state_pool: torch.Tensor,
    slots: torch.Tensor,
    *,
    use_qk_l2norm: bool = True,
    scale: float | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """One decode step of N rows, each against its slot of the pool, updated in place.

    Args:
        q, k: ``[N, H, K]``; v: ``[N, HV, V]``; g (log decay, fp32): ``[N, HV]``; beta: ``[N, HV]``.
        state_pool: ``[S, HV, K, V]`` fp32, each slot contiguous; ``state_pool[slots[i]]`` is row i's
            state and is overwritten with the new one. Other slots are not touched.
        slots: ``[N]`` int32 / int64; a negative slot marks a padding row (output zeros, no state
            touched). The live rows' slots must be distinct and ``< S`` (not checked: no host reads).
        scale: query scale, default ``K ** -0.5`` (applied after the optional L2 norm).
    Returns:
        o ``[N, HV, V]`` in q's dtype.
    """
    _check(q, k, v, g, beta, state_pool, slots)
    if resolve_triton(backend, q.device):
        from .gdn_decode_triton import gdn_decode_slots_triton

        return gdn_decode_slots_triton(q, k, v, g, beta, state_pool, slots, use_qk_l2norm, scale)
    return gdn_decode_slots_torch(q, k, v, g, beta, state_pool, slots, use_qk_l2norm, scale)
