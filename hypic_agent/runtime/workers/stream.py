"""A worker's build, streamed: each layer group of a batch's entries goes to rank 0 once it is built.

``ColdBatch`` (``hypic/build.py``) runs a packed batch one layer at a time, and after layer ``l``
every entry of the batch holds its layer ``l``; the entries of one batch are all finished by the
same, last, layer, so no entry is done before the others and could go back whole earlier. What can
go early is a layer group across the batch: ``build_streamed`` hands each group to ``emit`` right
after its last layer's mixer (an entry reads nothing of a layer's output stage: the runner's layer
loop calls its ``mixed`` hook there), and the ``Streamer`` sends it with the pair group's
asynchronous ``isend``, so the transfer of group g runs while the layers of group g+1 are built (on
gloo's transport thread on CPU, on NCCL's stream on a GPU). The forward is ``build_entries``': the
same entries, bit for bit.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hypic_agent.runtime.hypic.build import ColdBatch
from hypic_agent.runtime.hypic.entry import SegmentEntry
from hypic_agent.runtime.models.hybrid import HybridForCausalLM
from hypic_agent.runtime.runner.layer_loop import run_layers
from hypic_agent.runtime.runner.plan import plan_forward
from hypic_agent.runtime.workers import protocol as wire
from hypic_agent.runtime.workers.channel import Channel

Emit = Callable[[int, int, int, list[SegmentEntry]], None]  # (group, start, end, the batch's entries)


@torch.no_grad()
def build_streamed(
    model: HybridForCausalLM,
    segments: Sequence[Sequence[int]],
    seams: Sequence[int],
    groups: Sequence[tuple[int, int]],
    emit: Emit,
    *,
    pair_dtype: torch.dtype = torch.float32,
    prefix: Sequence[int] = (),
) -> list[SegmentEntry]:
    """``build_entries``, calling ``emit`` with each of ``groups`` (``protocol.layer_groups``) as soon
    as the batch's layers of that group are built (``prefix``: the build context's tokens, as the job
    carries them)."""
    batch = ColdBatch(model, segments, seams, pair_dtype=pair_dtype, prefix=prefix)
    ends = {end: (g, start) for g, (start, end) in enumerate(groups)}

    def mixed(li: int) -> None:  # the batch's layer li is built: a group may be complete
        if li + 1 in ends:
            g, start = ends[li + 1]
            emit(g, start, li + 1, batch.entries)

    run_layers(model, plan_forward(None, [], [], colds=(batch,), device=batch.ids.device), None, mixed=mixed)
    return batch.entries


class Streamer:
    """Sends one job's layer groups as they come (``layers``, the ``Emit`` of ``build_streamed``) and
    its ``DONE``; ``finish`` waits until every send of the job has gone out. ``group_delay_s``: a
    pause after each group (fault injection: lets a test kill a worker mid-stream)."""

    def __init__(self, chan: Channel, job: int, group_delay_s: float = 0.0) -> None:
        self.chan = chan
        self.job = job
        self.group_delay_s = group_delay_s
        self.pending: list[Any] = []  # works of the sends started (each keeps its tensor alive)

    def layers(self, group: int, start: int, end: int, entries: list[SegmentEntry]) -> None:
        for i, e in enumerate(entries):
            tensors = wire.layer_tensors(e, start, end)
            meta = wire.encode_meta(tensors)
            self._send(torch.cat([wire.header(wire.LAYERS, self.job, i, group, meta.numel()), meta]))
            for flat in wire.pack(tensors):
                self._send(flat)
        if self.group_delay_s:
            time.sleep(self.group_delay_s)

    def finish(self, n_entries: int, build_us: int) -> None:
        self._send(wire.header(wire.DONE, self.job, n_entries, build_us, 0))
        for work in self.pending:
            work.wait()
        self.pending.clear()

    def _send(self, t: torch.Tensor) -> None:
        self.pending.append(self.chan.isend(t))
