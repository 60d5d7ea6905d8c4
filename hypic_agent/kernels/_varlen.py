"""Helpers for token-packed ("varlen") batches: ``x [T, ...]`` plus ``cu_seqlens [N+1]``."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import torch


def cu_seqlens(lengths: Sequence[int]) -> torch.Tensor:
    """``[N+1]`` int32 cumulative lengths, on the host (what attention reads its bounds from: no sync)."""
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    if lengths:
        cu[1:] = torch.cumsum(torch.tensor(list(lengths), dtype=torch.int32), 0)
    return cu


def normalize_cu_seqlens(cu_seqlens: torch.Tensor | None, total: int, device: torch.device) -> torch.Tensor:
    """Return ``cu_seqlens [N+1]`` (int32, or int64 if given so) on ``device``; ``None`` means one
    sequence of ``total`` tokens.

    Raises ``ValueError`` when it does not start at 0, decreases, or does not end at ``total``.
    The value checks need host values, so they run only for CPU tensors (no device sync on CUDA).
    An int32/int64 tensor already on ``device`` is returned as is (same object).
    """
    if cu_seqlens is None:
        return torch.tensor([0, total], dtype=torch.int32, device=device)
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens must be 1-D with N+1 >= 2 entries, got shape {tuple(cu_seqlens.shape)}")
    dtype = cu_seqlens.dtype if cu_seqlens.dtype in (torch.int32, torch.int64) else torch.int32
    cu = cu_seqlens.to(device=device, dtype=dtype)
    if cu_seqlens.is_cuda:
        return cu
    lens = cu[1:] - cu[:-1]
    if int(cu[0]) != 0 or int(cu[-1]) != total or bool((lens < 0).any()):
        raise ValueError(
            f"cu_seqlens must start at 0, be non-decreasing and end at T={total}; got {cu.tolist()[:8]}..."
        )
    return cu


def seq_lengths(cu_seqlens: torch.Tensor) -> list[int]:
    """Per-sequence lengths as Python ints."""
    return (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()


def seq_ids(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """``[T]`` int64: the sequence index of every packed token."""
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    return torch.repeat_interleave(torch.arange(lens.numel(), device=cu_seqlens.device), lens, output_size=total)


# the int64 views of the last int32 ``cu_seqlens`` (input, view), newest last: a forward alternates between
# several every layer (a prefix-cache split runs each linear layer over ``cu_first`` then ``cu_rest``; a step
# with k composed requests runs each linear layer over the pool rows' bounds, then each combine's pieces).
# As many as fla's own identity cache keeps (FLA_TENSOR_CACHE_SIZE, set in ``kernels/__init__``): with
# 4 kept, a step of 8 combines made a new view for every combine at every layer, fla missed each time
# and copied chunk indices to the host (a device sync) 8 x 15 times a step.
_INT64_VIEWS: list[tuple[torch.Tensor, torch.Tensor]] = []
_INT64_VIEWS_KEPT = 64


def as_int64(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """int64 view of ``cu_seqlens`` for fla, memoised by identity for the last few inputs so that every
    layer of a forward passes fla the *same* tensor for the same bounds (fla caches chunk indices by
    tensor identity; a miss costs a blocking device->host copy per call). Callers must not modify a
    cu_seqlens tensor in place after using it."""
    if cu_seqlens.dtype == torch.int64:
        return cu_seqlens
    for src, view in _INT64_VIEWS:
        if src is cu_seqlens:
            return view
    out = cu_seqlens.long()
    _INT64_VIEWS.append((cu_seqlens, out))
    if len(_INT64_VIEWS) > _INT64_VIEWS_KEPT:
        del _INT64_VIEWS[0]
    return out


def fla_chunk_tables(lens: list[int], chunk: int = 64) -> tuple[list[tuple[int, int]], list[int]]:
    """fla's varlen chunk indices ``[(sequence, chunk)]`` and per-sequence chunk offsets ``[N+1]`` for
    sequences of ``lens`` tokens, computed on the host (fla derives them from a device ``cu_seqlens``
    with a blocking copy)."""
    counts = [-(-n // chunk) for n in lens]
    return [(i, c) for i, n in enumerate(counts) for c in range(n)], [0, *itertools.accumulate(counts)]


def concat_ranges(spans: list[tuple[int, int]]) -> np.ndarray:
    """``[(a, b), ...]`` -> the concatenated ``arange(a, b)`` (int64, host), with no per-span ops."""
    if not spans:
        return np.zeros(0, dtype=np.int64)
    starts = np.array([a for a, _ in spans], dtype=np.int64)
    lens = np.array([b - a for a, b in spans], dtype=np.int64)
    # element j of the output, in span i: j + start_i - (tokens of the spans before i)
    shift = np.repeat(starts - np.cumsum(lens) + lens, lens)
    return np.arange(int(lens.sum()), dtype=np.int64) + shift
