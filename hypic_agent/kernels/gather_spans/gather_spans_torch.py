"""Plain-PyTorch twin of ``gather_spans.gather_spans``: the same copies from the source tensors instead of
their pointers (the reference of ``gather_spans_triton``; table layout in ``gather_spans``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def gather_spans_torch(
    srcs: Sequence[torch.Tensor | None], offsets: Sequence[int], numels: Sequence[int], dst: torch.Tensor
) -> torch.Tensor:
    """Twin of ``gather_spans`` from the source tensors: per span ``dst.view(-1)[off : off + numel]``
    gets the first ``numel`` elements of ``src`` (zeros where ``src`` is None); returns ``dst``."""
    flat = dst.view(-1)
    for src, off, n in zip(srcs, offsets, numels, strict=True):
        flat[off : off + n] = 0 if src is None else src.reshape(-1)[:n].to(dst.dtype)
    return dst
