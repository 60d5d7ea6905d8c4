"""``upload``: a host tensor onto the device without waiting for the device's queued work.

A copy from pageable host memory waits for the work already queued on the stream, so a step built
while the previous one runs (the overlapped decode) would wait for it. On CUDA the tensor is staged in
pinned memory (PyTorch's caching host allocator keeps the buffer until the copy has run) and the copy
is queued on the stream; elsewhere it is a plain ``to``.
"""

from __future__ import annotations

import torch


def upload(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``host`` (CPU) on ``device``, queued behind the stream's work on CUDA, never waiting for it."""
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
