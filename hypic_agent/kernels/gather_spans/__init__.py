"""Gather spans: copy N contiguous spans of cached tensors, named by their data pointers, into one
destination in one launch.

A combine forward splices cached state that lives in many entry tensors: every linear layer's conv
tail per piece, every attention layer's body keys and values per segment. Stacking them with
``torch.stack`` / ``cat`` costs host time per tensor per layer and reads per-entry tensor objects,
which a CUDA graph cannot; a pointer table built on the host (``span_table``) and copied once lets one
kernel do it, and a graph replays it with the table refreshed in place.

A table row is ``(src, dst_offset, numel)`` int64: ``numel`` elements from the address ``src`` (of
the destination's dtype) to ``dst.view(-1)[dst_offset:]``; ``src == 0`` writes zeros (a piece with
no cached body before it starts its conv from zeros).

``gather_spans_torch`` (``gather_spans_torch.py``) is the twin (from the source tensors);
``gather_spans`` dispatches (Triton on CUDA, ``gather_spans_triton``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..backend import resolve_triton
from .gather_spans_torch import gather_spans_torch

__all__ = ["gather_spans", "gather_spans_torch", "span_table"]


def span_table(rows: Sequence[tuple[int, int, int]]) -> torch.Tensor:
    """``[(src pointer or 0, dst offset, numel), ...]`` -> ``[N, 3]`` int64 host table."""
    return torch.tensor(list(rows), dtype=torch.int64).reshape(-1, 3)


def gather_spans(table: torch.Tensor, dst: torch.Tensor, max_numel: int, *, backend: str = "auto") -> torch.Tensor:
    """Copy the spans of ``table [N, 3]`` int64 (on ``dst``'s device) into the contiguous ``dst``;
    ``max_numel``: the longest span (host int: the launch grid). Zero spans (``src == 0``) write
    zeros. Returns ``dst``. Spans must not overlap in ``dst``."""
    if table.dim() != 2 or table.shape[1] != 3 or table.dtype != torch.int64:
        raise ValueError(f"need an [N, 3] int64 span table, got {tuple(table.shape)} {table.dtype}")
    if not dst.is_contiguous():
        raise ValueError("the destination of gather_spans must be contiguous")
    if table.shape[0] == 0 or max_numel <= 0:
        return dst
    if resolve_triton(backend, dst.device):
        from .gather_spans_triton import gather_spans_triton

        return gather_spans_triton(table, dst, max_numel)
    raise ValueError("gather_spans reads raw pointers: it needs the Triton kernel (CUDA or TRITON_INTERPRET=1)")
