"""``PairSink``: where entry building writes each segment's body pair.

The pairs of one packed batch belong to different cache entries, each owning its tensors (an
evicted entry frees its own memory). Kernels that produce the pairs write them straight into those
tensors through a pointer table instead of into a batch tensor that is then copied entry by entry
(16 segments x 30 layers of fp32 pairs were ~2,000 copies, 4.3 ms of an 18 ms build overhead on
the H200).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .backend import to_device_async


@dataclass(frozen=True)
class PairSink:
    """Per segment j: ``T[j] [HV, K, K]`` and ``S[j] [HV, K, V]`` (one dtype, contiguous, one device)
    and ``pointers [N, 2]`` int64 on that device: their data pointers, for kernels. ``stack``: the
    ``[N, ...]`` tensors the per-segment ones are views of (``stacked`` sinks only)."""

    T: tuple[torch.Tensor, ...]
    S: tuple[torch.Tensor, ...]
    pointers: torch.Tensor
    stack: tuple[torch.Tensor, torch.Tensor] | None = None

    @classmethod
    def over(cls, T: Sequence[torch.Tensor], S: Sequence[torch.Tensor]) -> PairSink:
        """A sink over existing tensors (they must outlive every write through it)."""
        if len(T) != len(S) or not T:
            raise ValueError(f"need one T and one S per segment; got {len(T)} and {len(S)}")
        dtypes = {t.dtype for t in (*T, *S)}
        devices = {t.device for t in (*T, *S)}
        if len(dtypes) != 1 or len(devices) != 1 or not all(t.is_contiguous() for t in (*T, *S)):
            raise ValueError("a pair sink needs contiguous tensors of one dtype on one device")
        ptrs = torch.tensor([(t.data_ptr(), s.data_ptr()) for t, s in zip(T, S, strict=True)], dtype=torch.int64)
        return cls(tuple(T), tuple(S), to_device_async(ptrs, T[0].device))

    @classmethod
    def stacked(cls, n: int, hv: int, kd: int, vd: int, device: torch.device, dtype: torch.dtype) -> PairSink:
        """A sink over fresh stacked tensors ``[n, HV, K, K]`` / ``[n, HV, K, V]`` (``stacks()``)."""
        T = torch.empty(n, hv, kd, kd, dtype=dtype, device=device)
        S = torch.empty(n, hv, kd, vd, dtype=dtype, device=device)
        sink = cls.over(list(T.unbind(0)), list(S.unbind(0)))
        return cls(sink.T, sink.S, sink.pointers, (T, S))

    @property
    def dtype(self) -> torch.dtype:
        return self.T[0].dtype

    def stacks(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(T [N, HV, K, K], S [N, HV, K, V])``: the tensors of a ``stacked`` sink, else a stacked copy."""
        return self.stack if self.stack is not None else (torch.stack(self.T), torch.stack(self.S))

    def fill(self, T: torch.Tensor, S: torch.Tensor) -> None:
        """Copy stacked pairs ``T [N, HV, K, K]``, ``S [N, HV, K, V]`` into the sink (converting dtype):
        the path for producers that cannot write through the pointers."""
        if T.shape[0] != len(self.T) or S.shape[0] != len(self.S):
            raise ValueError(f"sink holds {len(self.T)} pairs, got {T.shape[0]}")
        torch._foreach_copy_(list(self.T) + list(self.S), list(T.unbind(0)) + list(S.unbind(0)))
