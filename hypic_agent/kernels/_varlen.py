"""Helpers for token-packed ("varlen") batches: ``x [T, ...]`` plus ``cu_seqlens [N+1]``."""

from __future__ import annotations

import torch


def normalize_cu_seqlens(cu_seqlens: torch.Tensor | None, total: int, device: torch.device) -> torch.Tensor:
    """Return ``cu_seqlens [N+1]`` int32 on ``device``; ``None`` means one sequence of ``total`` tokens.

    Raises ``ValueError`` when it does not start at 0, decreases, or does not end at ``total``.
    The value checks need host values, so they run only for CPU tensors (no device sync on CUDA).
    An int32 tensor already on ``device`` is returned as is (same object).
    """
    if cu_seqlens is None:
        return torch.tensor([0, total], dtype=torch.int32, device=device)
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens must be 1-D with N+1 >= 2 entries, got shape {tuple(cu_seqlens.shape)}")
    cu = cu_seqlens.to(device=device, dtype=torch.int32)
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
