"""Decode attention over a paged KV cache (vLLM-style page pool), one query token per sequence.

Key ``j`` of sequence ``i`` is slot ``j % page_size`` of page ``block_table[i, j // page_size]``;
the query (already rotated) sits at position ``context_lens[i] - 1`` and sees keys
``0 .. context_lens[i] - 1`` (stored already rotated). GQA: query head ``h`` reads kv head
``h // (Hq // Hkv)``. A sequence with ``context_lens == 0`` (a padding row of a CUDA-graph batch)
gets zeros and reads no page.

On CUDA with triton (``backend="auto"`` or ``"fla"``) the split-K Triton kernel runs
(``paged_attention_triton``: CUDA-graph capturable, no host sync); on CPU, or with
``backend="torch"``, the twin (``paged_attention_torch``: gathers pages, host syncs).
"""

from __future__ import annotations

import torch

from ..backend import resolve_triton
from .paged_attention_torch import paged_decode_attention_torch

__all__ = ["TRITON_MAX_HEAD_DIM", "paged_decode_attention", "paged_decode_attention_torch"]

TRITON_MAX_HEAD_DIM = 256  # head dims (D, Dv) up to which the Triton kernel runs


def _check(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    num_splits: int | None,
) -> None:
    """Shapes, dtypes and devices (no data read: no host sync). ``ValueError`` on a mismatch."""
    shapes = (
        f"q {tuple(q.shape)}, k_cache {tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)}, "
        f"block_table {tuple(block_table.shape)}, context_lens {tuple(context_lens.shape)}"
    )
    if q.dim() != 3 or k_cache.dim() != 4 or v_cache.dim() != 4 or block_table.dim() != 2 or context_lens.dim() != 1:
        raise ValueError(
            "need q [N, Hq, D], k_cache [P, page_size, Hkv, D], v_cache [P, page_size, Hkv, Dv], "
            f"block_table [N, max_blocks], context_lens [N]; got {shapes}"
        )
    N, Hq, D = q.shape
    _, page_size, Hkv, Dk = k_cache.shape
    if v_cache.shape[:3] != k_cache.shape[:3]:
        raise ValueError(f"k_cache and v_cache need the same [P, page_size, Hkv]; got {shapes}")
    if Dk != D:
        raise ValueError(f"q and k_cache need the same head dim D; got {shapes}")
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"need Hq a multiple of Hkv; got {shapes}")
    if block_table.shape[0] != N or context_lens.shape[0] != N:
        raise ValueError(f"block_table and context_lens need one row per sequence (N = {N}); got {shapes}")
    if page_size < 1 or page_size & (page_size - 1):
        raise ValueError(f"page_size must be a power of two; got {page_size} ({shapes})")
    if not q.is_floating_point() or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        dtypes = f"{q.dtype}, {k_cache.dtype}, {v_cache.dtype}"
        raise ValueError(f"q, k_cache, v_cache need one floating dtype; got {dtypes}")
    if block_table.is_floating_point() or block_table.is_complex() or block_table.dtype == torch.bool:
        raise ValueError(f"block_table needs an integer dtype (int32); got {block_table.dtype}")
    if context_lens.is_floating_point() or context_lens.is_complex() or context_lens.dtype == torch.bool:
        raise ValueError(f"context_lens needs an integer dtype (int32); got {context_lens.dtype}")
    devices = {t.device for t in (q, k_cache, v_cache, block_table, context_lens)}
    if len(devices) != 1:
        raise ValueError(f"all tensors need one device; got {sorted(str(d) for d in devices)}")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("k_cache and v_cache need unit stride on their last (head) dim")
    if num_splits is not None and num_splits < 1:
        raise ValueError(f"num_splits must be >= 1 (or None); got {num_splits}")


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    *,
    scale: float,
    backend: str = "auto",
    num_splits: int | None = None,
) -> torch.Tensor:
    """Decode attention of one query token per sequence over its pages.

    Args:
        q: ``[N, Hq, D]`` (rotated). k_cache: ``[P, page_size, Hkv, D]`` (rotated keys), v_cache:
            ``[P, page_size, Hkv, Dv]``, one layer's pages, q's dtype; page_size a power of two.
        block_table: ``[N, max_blocks]`` int32, the page ids of each sequence in order (entries past
            ``cdiv(context_lens[i], page_size)`` are never read).
        context_lens: ``[N]`` int32, valid keys per sequence (the current token's key included),
            ``0 <= context_lens[i] <= max_blocks * page_size`` (checked by the twin only: the
            Triton path reads lengths on the device).
        scale: softmax scale (e.g. ``D ** -0.5``).
        backend: ``"auto"`` (Triton on CUDA, the twin on CPU), ``"torch"`` or ``"fla"`` (the
            Triton kernel; needs CUDA, triton and head dims <= ``TRITON_MAX_HEAD_DIM``).
        num_splits: key ranges per (sequence, kv head) on the Triton path; default from shapes
            (``paged_attention_triton.default_num_splits``), so a captured graph keeps its grid.
    Returns:
        ``[N, Hq, Dv]`` in q's dtype (fp32 accumulation).
    """
    _check(q, k_cache, v_cache, block_table, context_lens, num_splits)
    use_triton = resolve_triton(backend, q.device)
    if use_triton and max(q.shape[-1], v_cache.shape[-1]) > TRITON_MAX_HEAD_DIM:
        if backend != "auto":
            raise ValueError(f"the Triton kernel needs head dims <= {TRITON_MAX_HEAD_DIM}; use backend='torch'")
        use_triton = False
    if use_triton:
        from .paged_attention_triton import paged_decode_attention_triton

        return paged_decode_attention_triton(
            q, k_cache, v_cache, block_table, context_lens, scale, num_splits=num_splits
        )
    return paged_decode_attention_torch(q, k_cache, v_cache, block_table, context_lens, scale)
