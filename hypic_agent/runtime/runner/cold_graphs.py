"""CUDA graphs of the cold segments' linear-layer core, one set per cold-batch layout.

A request at 80% hit rate builds its few cold segments inside the combine forward (``ColdBatch``).
Each linear layer's cold core (the causal conv over the packed segments, then fla's chunked delta
rule writing the body pairs: some 17 kernels behind fla's Python wrappers) costs more host time
than GPU time at a few 1k-token segments (measured on the H200, see docs/benchmarks.md), which made
such requests host-bound. In a RAG workload the cold batch's layout repeats (documents chunked to one length:
the same lengths and seams), so each layer's core is captured once per layout and replayed in one
launch:

* inputs: the layer's ``mixed, z, g, beta`` rows of the cold tokens, read in place. A graph
  replays only when they sit where they sat at capture, which the chained stage buffers of
  ``runner.stage_graphs`` make so; elsewhere the core runs eagerly;
* the batch tables (``cu``, ``SeamSplit``) are those of the batch captured: same layout, same
  content (the runner keeps them alive);
* the pairs are written through a static copy of the sink's pointer table, rewritten once per
  request;
* the outputs (o, the final conv states) live in the graph's memory pool: o is consumed by the
  layer's ``mixer_out``, and the conv tails are copied into the request's entries right after the
  replay (``ColdBatch.run_layer``).

A layout is captured at its ``capture_after``-th batch (the first runs eagerly: it autotunes); up to
``max_layouts`` are kept, least recently used dropped first. A capture failure logs once and turns
the runner off. Memory: a kept layout holds each layer's outputs and scratch in the graphs' pool
(gigabytes for a few 1k-token segments of a large shape), not counted in the entry budgets.
"""

from __future__ import annotations

import collections
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from hypic_agent.kernels.pair_sink import PairSink

if TYPE_CHECKING:
    from hypic_agent.runtime.hypic.build import ColdBatch

log = logging.getLogger(__name__)

Core = Callable[..., tuple[torch.Tensor, torch.Tensor]]  # (sink, mixed, z, g, beta) -> (o, conv_final)
MAX_TRACKED = 256  # layouts whose sightings are counted
_SERIAL = itertools.count(1)


def new_serial() -> int:
    """A process-unique id for a cold batch (which batch's pointers a static table holds)."""
    return next(_SERIAL)


def _addresses(xs: tuple[torch.Tensor, ...]) -> tuple[tuple[int, tuple[int, ...], tuple[int, ...]], ...]:
    return tuple((x.data_ptr(), tuple(x.shape), tuple(x.stride())) for x in xs)


@dataclass
class _Layout:
    table: torch.Tensor  # [L_lin, N, 2] int64: the sinks' pointers of batch ``owner``
    pool: Any
    owner: int = 0
    # per layer: (graph, input addresses, outputs in the pool, the capturing batch's tables it reads)
    graphs: dict[int, tuple[torch.cuda.CUDAGraph, tuple[Any, ...], tuple[torch.Tensor, torch.Tensor], Any]] = field(
        default_factory=dict
    )

    def point_at(self, batch: ColdBatch) -> None:
        """Put ``batch``'s pair pointers into the static table (once per batch)."""
        if self.owner != batch.serial:
            self.table.copy_(batch.table)
            self.owner = batch.serial


class ColdGraphs:
    """Per (cold-batch layout, linear layer) graphs of ``ColdBatch``'s linear core; a runner's
    ``GraphSet.colds``."""

    def __init__(self, capture_after: int = 2, max_layouts: int = 2) -> None:
        self.capture_after = capture_after
        self.max_layouts = max_layouts
        self.disabled: str | None = None
        self.seen: collections.OrderedDict[tuple[Any, ...], int] = collections.OrderedDict()
        self.layouts: collections.OrderedDict[tuple[Any, ...], _Layout] = collections.OrderedDict()
        self.replays = 0
        self._counted: set[int] = set()  # serials of the batches already counted (the last few)

    def _sighting(self, key: tuple[Any, ...], serial: int) -> int:
        """Count batch ``serial`` once for ``key``; returns the layout's count."""
        if serial not in self._counted:
            self._counted = {s for s in self._counted if s > serial - 64} | {serial}
            self.seen[key] = self.seen.pop(key, 0) + 1
            while len(self.seen) > MAX_TRACKED:
                self.seen.popitem(last=False)
        return self.seen.get(key, 0)

    def run(
        self, batch: ColdBatch, li: int, core: Core, xs: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``li``'s cold core ``core(sink, *xs)`` for ``batch`` (its layout key, serial, pair
        sinks and their pointer table ``[L_lin, N, 2]``), replayed from a graph when it can be."""
        if self.disabled or not xs[0].is_cuda or torch.is_grad_enabled():
            return core(batch.sinks[li], *xs)
        key = batch.layout_key
        count = self._sighting(key, batch.serial)
        lay = self.layouts.get(key)
        if lay is not None:
            self.layouts.move_to_end(key)
            entry = lay.graphs.get(li)
            if entry is not None and entry[1] == _addresses(xs):
                lay.point_at(batch)
                entry[0].replay()
                self.replays += 1
                return entry[2]
        out = core(batch.sinks[li], *xs)  # eager (and the warm-up of a capture)
        if count >= self.capture_after and (lay is None or li not in lay.graphs):
            self._capture(batch, li, core, xs)
        return out

    def _capture(self, batch: ColdBatch, li: int, core: Core, xs: tuple[torch.Tensor, ...]) -> None:
        key = batch.layout_key
        lay = self.layouts.get(key)
        try:
            if lay is None:
                while len(self.layouts) >= self.max_layouts:
                    self.layouts.popitem(last=False)
                lay = _Layout(batch.table.clone(), torch.cuda.graph_pool_handle(), batch.serial)
                self.layouts[key] = lay
            lay.point_at(batch)
            sink = batch.sinks[li]
            static = PairSink(sink.T, sink.S, lay.table[batch.sink_row[li]])
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=lay.pool):
                out = core(static, *xs)
        except Exception as err:  # never fail a request over a graph
            self.disabled = f"{type(err).__name__}: {err}"
            self.layouts.clear()
            log.warning("CUDA graph capture of the cold core failed (%s); running eagerly", self.disabled)
            return
        lay.graphs[li] = (graph, _addresses(xs), out, (batch.cu, batch.split))  # the tables the graph reads
