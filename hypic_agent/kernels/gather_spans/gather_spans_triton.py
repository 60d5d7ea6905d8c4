"""Span gather in Triton (CUDA, or the CPU interpreter in tests; imported lazily). Twin:
``gather_spans_torch``; layout of the table in ``gather_spans``."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096


@triton.jit
def _gather_spans_kernel(table, dst, BLOCK: tl.constexpr):
    """Grid ``(N, cdiv(max_numel, BLOCK))``: block ``j`` of span ``i``."""
    i = tl.program_id(0).to(tl.int64)
    start = tl.program_id(1).to(tl.int64) * BLOCK
    numel = tl.load(table + i * 3 + 2)
    if start < numel:
        raw = tl.load(table + i * 3)
        off = tl.load(table + i * 3 + 1)
        idx = start + tl.arange(0, BLOCK).to(tl.int64)
        m = idx < numel
        src = raw.to(tl.pointer_type(dst.dtype.element_ty))
        vals = tl.load(src + idx, mask=m & (raw != 0), other=0.0)
        tl.store(dst + off + idx, vals, mask=m)


def gather_spans_triton(table: torch.Tensor, dst: torch.Tensor, max_numel: int) -> torch.Tensor:
    """table ``[N, 3]`` int64 (src, dst offset, numel), dst contiguous -> dst (filled in place)."""
    grid = (table.shape[0], triton.cdiv(max_numel, BLOCK))
    _gather_spans_kernel[grid](table, dst, BLOCK=BLOCK, num_warps=8)
    return dst
