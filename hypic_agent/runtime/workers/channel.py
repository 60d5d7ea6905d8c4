"""A two-party process group between rank 0 and one worker, and point-to-point messages over it.

Each worker gets its own pair group (rank 0 = the pool, rank 1 = the worker) over a prefix of the
pool's ``TCPStore`` (an address/port rendezvous): a worker that dies or is replaced takes only its
own group down, and a restarted worker joins a fresh one under a new prefix while the others keep
running. The backend is gloo on CPU and NCCL on CUDA, the same code on one host or several.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

# a backend object (ProcessGroupGloo / ProcessGroupNCCL); torch's stubs give its send/recv no common type
PairGroup = Any


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def pair_group(store: dist.Store, prefix: str, rank: int, device: torch.device, timeout_s: float) -> PairGroup:
    """This side (``rank`` 0 or 1) of the pair group under ``prefix``; blocks until both have joined."""
    scoped = dist.PrefixStore(prefix, store)
    timeout = timedelta(seconds=timeout_s)
    if backend_for(device) == "nccl":  # pragma: no cover - no GPU in CI
        torch.cuda.set_device(device)
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(scoped, rank, 2, opts)
    return dist.ProcessGroupGloo(scoped, rank, 2, timeout)


class Channel:
    """Messages to and from the other side of a pair group: int64 control tensors and raw tensors.

    ``device``: where the group's tensors must live (CPU for gloo, this side's GPU for NCCL).
    Every call but ``isend`` blocks until its op is done, or raises when the peer is gone or the
    group's timeout passes.
    """

    def __init__(self, group: PairGroup, rank: int, device: torch.device) -> None:
        self.group = group
        self.peer = 1 - rank
        self.device = device

    def send(self, t: torch.Tensor) -> None:
        self.isend(t).wait()

    def isend(self, t: torch.Tensor) -> Any:
        """Start sending ``t`` and return its work (``wait()`` it before reusing ``t``): sends to the
        peer arrive in the order they were started (one tag, one pair)."""
        return self.group.send([t.to(self.device).contiguous()], self.peer, 0)

    def recv_into(self, t: torch.Tensor) -> torch.Tensor:
        self.group.recv([t], self.peer, 0).wait()
        return t

    def recv(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return self.recv_into(torch.empty(shape, dtype=dtype, device=self.device))

    def recv_ints(self, n: int) -> torch.Tensor:
        """``n`` int64 control values, on the host."""
        if n == 0:
            return torch.empty(0, dtype=torch.int64)
        return self.recv((n,), torch.int64).cpu()

    def close(self) -> None:
        with contextlib.suppress(Exception):  # a group whose peer died may refuse; it is dropped either way
            self.group.shutdown()
