"""Kimi Delta Attention (KDA): prefill over packed sequences, decode steps and transition pairs.

Per head, with q, k l2-normed, q scaled by ``K^-0.5``, a log-decay ``g [K]`` per key channel and
``beta`` per head: ``S_t = (I - beta_t k_t k_t^T) Diag(exp g_t) S_{t-1} + beta_t k_t v_t^T``,
``o_t = q_t^T S_t``; state ``[K, V]`` fp32. Layouts: q, k, g ``[T, H, K]``, v ``[T, H, V]``, beta
``[T, H]``, states ``[N, H, K, V]``; ``cu_seqlens [N+1]`` (None: one sequence).

On CUDA (``backend`` "auto" / "fla") fla-core's kernels run (``kda_fla``: ``chunk_kda`` for prefill
and pairs, ``fused_recurrent_kda`` for the decode steps, its pool-indexed form for the runner's
slots; ``fused_recurrent_kda`` also for varlen scans of at most ``recurrent_max_tokens`` tokens, which
no host read then blocks from a CUDA graph); elsewhere the plain-PyTorch twin (``kda_torch``, a token
loop). Outputs come in the kernel's dtype (q's on fla, fp32 on torch); states and pairs are fp32.
"""

from __future__ import annotations

import torch

from .._varlen import normalize_cu_seqlens
from ..backend import resolve_backend
from . import kda_torch

__all__ = ["kda", "kda_decode_slots", "kda_pairs", "kda_step"]


def kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    backend: str = "auto",
    recurrent_max_tokens: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k ``[T, H, K]``, v ``[T, H, V]``, g ``[T, H, K]``, beta ``[T, H]``, ``initial_state [N, H, K, V]``
    (None: zeros) -> (o ``[T, H, V]``, final states ``[N, H, K, V]`` fp32). On fla, T <=
    ``recurrent_max_tokens`` runs the fused recurrent kernel (``KernelConfig.recurrent_scan_max_tokens``)."""
    if k.shape[0] and resolve_backend(backend, q.device) == "fla":
        from .kda_fla import kda_fla

        cu = normalize_cu_seqlens(cu_seqlens, k.shape[0], q.device)
        return kda_fla(q, k, v, g, beta, cu, initial_state, recurrent=k.shape[0] <= recurrent_max_tokens)
    return kda_torch.kda(q, k, v, g, beta, cu_seqlens=cu_seqlens, initial_state=initial_state)


def kda_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    *,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence: q, k ``[N, H, K]``, v ``[N, H, V]``, g ``[N, H, K]``, beta ``[N, H]``,
    state ``[N, H, K, V]`` -> (o ``[N, H, V]``, new state fp32; the input state is not modified)."""
    if k.shape[0] and resolve_backend(backend, q.device) == "fla":
        from .kda_fla import kda_step_fla

        return kda_step_fla(q, k, v, g, beta, state)
    return kda_torch.kda_step(q, k, v, g, beta, state)


def kda_decode_slots(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state_pool: torch.Tensor,
    slots: torch.Tensor,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """``kda_step`` of N rows, row i against ``state_pool[slots[i]]`` (``[S, H, K, V]`` fp32), which is
    overwritten with the new state; other slots are not touched. slots ``[N]`` int32 / int64, distinct
    for live rows -> o ``[N, H, V]``. On CUDA one fla launch with no host reads (capturable)."""
    if state_pool.dtype != torch.float32 or tuple(state_pool.shape[1:]) != (v.shape[1], k.shape[2], v.shape[2]):
        raise ValueError(f"state_pool must be [S, H, K, V] fp32, got {tuple(state_pool.shape)} {state_pool.dtype}")
    if k.shape[0] and resolve_backend(backend, q.device) == "fla":
        from .kda_fla import kda_decode_slots_fla

        return kda_decode_slots_fla(q, k, v, g, beta, state_pool, slots)
    return kda_torch.kda_decode_slots_torch(q, k, v, g, beta, state_pool, slots)


def kda_pairs(
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor,
    backend: str = "auto",
    recurrent_max_tokens: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence's pair from a zero state: k, g ``[T, H, K]``, v ``[T, H, V]``, beta ``[T, H]`` ->
    (T ``[N, H, K, K]``, S ``[N, H, K, V]``) fp32, with ``S_after = T @ S_in + S``. T is the token steps
    applied to the identity (each column of I a state with V = K columns and v = 0). ``recurrent_max_tokens``:
    as in ``kda``."""
    if k.shape[0] and cu_seqlens.numel() > 1 and resolve_backend(backend, k.device) == "fla":
        from .kda_fla import kda_pairs_fla

        cu = normalize_cu_seqlens(cu_seqlens, k.shape[0], k.device)
        return kda_pairs_fla(k, v, g, beta, cu, recurrent=k.shape[0] <= recurrent_max_tokens)
    return kda_torch.kda_pairs(k, v, g, beta, cu_seqlens=cu_seqlens)
