"""Decay-only linear attention (Mamba2's SSD, Lightning, Ring-linear after its RoPE): prefill, decode
step, transition pairs and their chain.

Per head h and token t, with a scalar log-decay ``g[t, h] <= 0``: ``S_t = exp(g_t) S_{t-1} + k_t v_t^T``,
``o_t = q_t^T S_t`` (no query scale; state ``[K, V]`` fp32). Layouts: q, k ``[T, G, K]`` (G groups, head
h reads group ``h // (H / G)``), v ``[T, H, V]``, g ``[T, H]``, states ``[N, H, K, V]``; ``cu_seqlens
[N+1]`` (None: one sequence). A span's pair is ``T [H] = exp(sum g)`` and ``S [H, K, V]`` from zero,
composed as ``T * S_in + S`` (``decay_chain``).

On CUDA (``backend`` "auto" / "fla") the prefill and the pairs' ``S`` run fla-core's
``chunk_simple_gla`` (``decay_attention_fla``; ``fused_recurrent_simple_gla`` for at most
``recurrent_max_tokens`` tokens, which no host read then blocks from a CUDA graph); elsewhere the plain-PyTorch twin
(``decay_attention_torch``, a chunked scan). The decode step (one token: a scale, an outer product
and a contraction per head), the pairs' ``T`` and the chain are torch on every device. Outputs come
in the kernel's dtype (bf16 / fp16 / fp32 on fla, fp32 on torch); states and pairs are fp32.
"""

from __future__ import annotations

import torch

from .._varlen import normalize_cu_seqlens
from ..backend import resolve_backend
from . import decay_attention_torch
from .decay_attention_torch import decay_chain, decay_step

__all__ = ["decay_attention", "decay_chain", "decay_pairs", "decay_step"]


def decay_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    backend: str = "auto",
    recurrent_max_tokens: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k ``[T, G, K]``, v ``[T, H, V]``, g ``[T, H]`` (log-decay), ``initial_state [N, H, K, V]`` (None:
    zeros) -> (o ``[T, H, V]``, final states ``[N, H, K, V]`` fp32). On fla, T <= ``recurrent_max_tokens``
    runs the fused recurrent kernel (``KernelConfig.recurrent_scan_max_tokens``)."""
    if v.shape[0] and resolve_backend(backend, v.device) == "fla":
        from .decay_attention_fla import decay_attention_fla

        cu = normalize_cu_seqlens(cu_seqlens, v.shape[0], v.device)
        return decay_attention_fla(q, k, v, g, cu, initial_state, recurrent=v.shape[0] <= recurrent_max_tokens)
    return decay_attention_torch.decay_attention(q, k, v, g, cu_seqlens=cu_seqlens, initial_state=initial_state)


def decay_pairs(
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor,
    backend: str = "auto",
    recurrent_max_tokens: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence's pair from a zero state: k ``[T, G, K]``, v ``[T, H, V]``, g ``[T, H]`` ->
    (T ``[N, H]`` = exp(sum g), S ``[N, H, K, V]``), fp32. ``recurrent_max_tokens``: as in ``decay_attention``."""
    if v.shape[0] and cu_seqlens.numel() > 1 and resolve_backend(backend, v.device) == "fla":
        from .decay_attention_fla import decay_pairs_fla

        cu = normalize_cu_seqlens(cu_seqlens, v.shape[0], v.device)
        return decay_pairs_fla(k, v, g, cu, recurrent=v.shape[0] <= recurrent_max_tokens)
    return decay_attention_torch.decay_pairs(k, v, g, cu_seqlens=cu_seqlens)
