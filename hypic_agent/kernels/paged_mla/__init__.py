"""Paged decode attention of an MLA layer in the absorbed form, one query token per sequence.

An MLA layer's pool pages hold the normed latent ``[R]`` and the shared rope key ``[E]`` of each
token (one "kv head"). The model absorbs ``kv_b_proj``'s key half into the query (``q_lat``) and its
value half into the output; in between, every head attends with key ``[latent | rope]`` and value
``latent``: ``softmax(scale * (q_lat . latent + q_rope . rope)) @ latent``. Key ``j`` of sequence
``i`` is slot ``j % page`` of page ``block_table[i, j // page]``.

On CUDA with triton (``backend="auto"`` or ``"fla"``) the Triton kernel runs (``paged_mla_triton``:
reads pages in place, CUDA-graph capturable); on CPU, or with ``backend="torch"``, the twin
(``paged_mla_torch``: gathers the block-table width, also capturable).
"""

from __future__ import annotations

import torch

from ..backend import resolve_triton
from .paged_mla_torch import paged_mla_decode_torch

__all__ = ["paged_mla_decode", "paged_mla_decode_torch"]


def _check(
    q_lat: torch.Tensor,
    q_rope: torch.Tensor,
    lat_cache: torch.Tensor,
    rope_cache: torch.Tensor,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
) -> None:
    """Shapes and devices (no data read). ``ValueError`` on a mismatch."""
    shapes = (
        f"q_lat {tuple(q_lat.shape)}, q_rope {tuple(q_rope.shape)}, lat_cache {tuple(lat_cache.shape)}, "
        f"rope_cache {tuple(rope_cache.shape)}, block_table {tuple(block_table.shape)}, "
        f"context_lens {tuple(context_lens.shape)}"
    )
    if q_lat.dim() != 3 or q_rope.dim() != 3 or lat_cache.dim() != 4 or rope_cache.dim() != 4:
        raise ValueError(
            "need q_lat [N, H, R], q_rope [N, H, E], lat_cache [P, page, 1, R], rope_cache [P, page, 1, E]; "
            f"got {shapes}"
        )
    if q_rope.shape[:2] != q_lat.shape[:2] or lat_cache.shape[-1] != q_lat.shape[-1]:
        raise ValueError(f"q_lat, q_rope and lat_cache disagree on N, H or R; got {shapes}")
    if rope_cache.shape[-1] != q_rope.shape[-1] or rope_cache.shape[:3] != lat_cache.shape[:3]:
        raise ValueError(f"rope_cache needs lat_cache's [P, page, 1] and q_rope's E; got {shapes}")
    if lat_cache.shape[2] != 1:
        raise ValueError(f"an MLA cache has one kv head; got {shapes}")
    if (
        block_table.dim() != 2
        or context_lens.dim() != 1
        or not block_table.shape[0] == context_lens.shape[0] == q_lat.shape[0]
    ):
        raise ValueError(f"block_table [N, max_blocks] and context_lens [N] need one row per sequence; got {shapes}")
    page = lat_cache.shape[1]
    if page < 1 or page & (page - 1):
        raise ValueError(f"the page size must be a power of two; got {page}")
    devices = {t.device for t in (q_lat, q_rope, lat_cache, rope_cache, block_table, context_lens)}
    if len(devices) != 1:
        raise ValueError(f"all tensors need one device; got {sorted(str(d) for d in devices)}")


def paged_mla_decode(
    q_lat: torch.Tensor,
    q_rope: torch.Tensor,
    lat_cache: torch.Tensor,
    rope_cache: torch.Tensor,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    *,
    scale: float,
    backend: str = "auto",
    num_splits: int | None = None,
) -> torch.Tensor:
    """Absorbed MLA decode over the page pool.

    Args:
        q_lat: ``[N, H, R]`` (``q_nope`` through ``kv_b_proj``'s key half); q_rope: ``[N, H, E]`` (rotated).
        lat_cache: ``[P, page, 1, R]`` normed latents; rope_cache: ``[P, page, 1, E]`` rope keys (rotated).
        block_table: ``[N, max_blocks]`` int32 page ids; context_lens: ``[N]`` int32 valid keys.
        scale: the softmax scale (``(nope + rope) ** -0.5``).
        backend: ``"auto"`` (Triton on CUDA, the twin on CPU), ``"torch"`` or ``"fla"`` (Triton; needs CUDA).
        num_splits: key ranges per (sequence, head block) on the Triton path; default from shapes.
    Returns:
        The latent-space output ``[N, H, R]``: fp32 from the twin, the caches' dtype from Triton.
    """
    _check(q_lat, q_rope, lat_cache, rope_cache, block_table, context_lens)
    if resolve_triton(backend, q_lat.device):
        from .paged_mla_triton import paged_mla_decode_triton

        dt = lat_cache.dtype
        return paged_mla_decode_triton(
            q_lat.to(dt), q_rope.to(dt), lat_cache, rope_cache, block_table, context_lens, scale, num_splits=num_splits
        )
    return paged_mla_decode_torch(q_lat, q_rope, lat_cache, rope_cache, block_table, context_lens, scale)
