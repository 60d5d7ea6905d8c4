"""Rank 0's side of one build job: send it, receive its entries layer group by layer group, assemble.

A job's entries arrive as the worker builds them (``protocol``: per layer group, per entry), each
group's tensors straight into rank 0's device; an entry is assembled from its groups only once the
job's ``DONE`` has arrived, and ``run_job`` returns whole entries or raises: a worker that dies or
times out mid-stream leaves nothing half-built behind (the caller rebuilds the job elsewhere).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from hypic_agent.runtime.hypic.entry import SegmentEntry
from hypic_agent.runtime.workers import protocol as wire
from hypic_agent.runtime.workers.channel import Channel


@dataclass(frozen=True)
class JobResult:
    """A job's entries (job order) and how their time went, as rank 0 saw it.

    ``transfer_ms``: per entry, rank 0's time receiving it (each layer group's control message to
    its last byte, summed over the groups). ``wall_ms``: the job at rank 0, from sending it to its ``DONE``.
    ``build_ms``: the worker's build of the batch (its layer loop; the groups' sends overlap it).
    """

    entries: list[SegmentEntry]
    transfer_ms: list[float]
    wall_ms: float
    build_ms: float


class ProtocolError(RuntimeError):
    """A reply that is not the one expected next (the worker is replaced, like a dead one)."""


def _expect(h: torch.Tensor, *fields: int) -> None:
    if h[: len(fields)].tolist() != list(fields):
        raise ProtocolError(f"unexpected reply {h.tolist()}, expected {list(fields)}")


def run_job(
    chan: Channel,
    job: wire.Job,
    layer_kinds: Sequence[str],
    home: torch.device,
    on_group: Callable[[], None] | None = None,
) -> JobResult:
    """Send ``job`` over ``chan`` and receive its entries onto ``home``; ``on_group`` is called after
    each (entry, layer group) message has arrived whole."""
    t_job = time.perf_counter()
    hdr, body = job.encode()
    chan.send(hdr)
    chan.send(body)
    n = len(job.segments)
    parts: list[list[torch.Tensor]] = [[] for _ in range(n)]
    transfer = [0.0] * n
    separate = home.type != "cuda"  # a CPU tier keeps tensors as they are: each its own storage
    for g, (start, end) in enumerate(wire.layer_groups(len(layer_kinds), job.stream_layers)):
        n_meta = wire.group_meta_len(layer_kinds, start, end)
        for i in range(n):
            ctl = chan.recv_ints(wire.HEADER + n_meta)  # waits for the worker's build of the group
            t0 = time.perf_counter()
            _expect(ctl, wire.LAYERS, job.job, i, g, n_meta)
            meta = wire.decode_meta(ctl[wire.HEADER :])
            flats = [chan.recv((k,), dt).to(home) for dt, k in wire.flat_layout(meta)]
            parts[i] += wire.unpack(flats, meta, separate=separate)
            transfer[i] += (time.perf_counter() - t0) * 1e3
            if on_group is not None:
                on_group()
    done = chan.recv_ints(wire.HEADER)
    _expect(done, wire.DONE, job.job, n)
    build_ms = int(done[3]) / 1e3
    total = max(1, sum(len(s) for s in job.segments))
    entries = [
        wire.assemble(t, layer_kinds, s, seam, build_ms * len(s) / total)
        for t, s, seam in zip(parts, job.segments, job.seams, strict=True)
    ]
    return JobResult(entries, transfer, (time.perf_counter() - t_job) * 1e3, build_ms)
