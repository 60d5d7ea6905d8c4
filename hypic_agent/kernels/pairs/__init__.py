"""Transition pairs of GDN token spans: ``S_after = T_C @ S_in + S_C`` for every packed sequence.

A span C acts on any incoming state affinely (HYPIC §2): ``T_C [HV, K, K]`` is the product of
the per-token transitions ``exp(g_t) (I - beta_t k_t k_t^T)`` (latest on the left) and
``S_C [HV, K, V]`` is the final state from a zero start. Both are fp32.

* torch (``pairs_torch``): run the gated delta rule with value dim ``V + K``, values ``[v | 0]``
  and initial state ``[0 | I]``; the final state splits into ``[S_C | T_C]``.
* fla (``pairs_fla``, CUDA): ``fla.ops.cp.chunk_fwd.chunk_cp_fwd_h(..., multi_seqs=True)`` writes
  the same summary ``hm [N, HV, K, V+K] = [h_local | M]`` for all sequences in one launch.
"""

from __future__ import annotations

import torch

from .._varlen import normalize_cu_seqlens
from ..backend import resolve_backend
from .pairs_torch import transition_pairs_torch

__all__ = ["apply_pair", "transition_pairs", "transition_pairs_torch"]


def transition_pairs(
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor | None = None,
    use_qk_l2norm: bool = True,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sequence transition pairs.

    Args:
        k: ``[T, H, K]``; v: ``[T, HV, V]``; g (log decay), beta: ``[T, HV]``.
        cu_seqlens: ``[N+1]`` int32 (None = one sequence).
    Returns:
        T ``[N, HV, K, K]`` and S ``[N, HV, K, V]``, fp32. An empty sequence gives (I, 0).
    """
    cu = normalize_cu_seqlens(cu_seqlens, k.shape[0], k.device)
    if resolve_backend(backend, k.device) == "fla":
        from .pairs_fla import transition_pairs_fla

        return transition_pairs_fla(k, v, g, beta, cu, use_qk_l2norm)
    return transition_pairs_torch(k, v, g, beta, cu, use_qk_l2norm)


def apply_pair(T: torch.Tensor, S: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """``T @ state + S`` in fp32: T ``[..., HV, K, K]``, S and state ``[..., HV, K, V]``."""
    return torch.matmul(T.float(), state.float()) + S.float()
