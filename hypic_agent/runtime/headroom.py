"""Allocator headroom: keep a free block in the CUDA caching allocator for the next request's entries.

A cold segment's entry is two fresh device allocations (``hypic.build._carve``: ~150 MB at the
Qwen3.5-35B-A3B shape, 1k tokens) that outlive the request, so while the GPU tier fills, each one
is a new ``cudaMalloc`` (0.3-0.6 ms of host time each on the H200) made before the request's first
kernel, with the GPU idle. ``top_up`` is called once a request's forward is queued, while the GPU is
busy with it: it asks the allocator for one block of ``nbytes`` and frees it again, so the next
request's entries are cut from a cached block. When a free block that large is already cached,
this is a lookup and nothing more; otherwise it is one ``cudaMalloc``, off the critical path.
"""

from __future__ import annotations

import torch


class AllocatorHeadroom:
    """``top_up()``: make sure the caching allocator of ``device`` holds a free block of ``nbytes``
    (no-op off CUDA or with ``nbytes == 0``)."""

    def __init__(self, device: torch.device, nbytes: int) -> None:
        if nbytes < 0:
            raise ValueError(f"headroom must be >= 0 bytes, got {nbytes}")
        self.device = device
        self.nbytes = nbytes if device.type == "cuda" else 0
        self.top_ups = 0  # calls that had to grow the allocator's reserve

    def top_up(self) -> None:
        if not self.nbytes:
            return
        before = torch.cuda.memory_reserved(self.device)
        try:
            block = torch.empty(self.nbytes, dtype=torch.uint8, device=self.device)
        except torch.OutOfMemoryError:  # a full GPU keeps serving: the entries then allocate as before
            return
        del block  # back to the cache, still reserved: the next allocations split it
        if torch.cuda.memory_reserved(self.device) > before:
            self.top_ups += 1
