"""CUDA graphs per combine layout: the whole combine forward replayed in a few launches.

A warm combine over a few hundred active tokens is bound by the host: some 600 launches and 80
stage-graph replays, each with Python and dispatcher time: its host time is of the order of its
GPU work, and longer whenever the host is slower (measured on the H200, see docs/benchmarks.md).
In a RAG or agent workload the layout repeats (same segment lengths, seams and question length)
while the segments change: what differs between such requests is which entries the forward
reads and the active token ids. With every cached tensor read through a pointer table
(``combine_inputs.CombineInputs.by_pointer``), the forward of one layout is a fixed sequence of
kernels over fixed addresses, so it is captured once (as graphs of ``LAYERS_PER_GRAPH`` layers in
one memory pool, replayed in order) and replayed with

1. the new active token ids copied into the captured layout's ``active_ids``,
2. the pointer tables rewritten in place (``CombineInputs.refresh``), and
3. the outputs (per-layer states, logits) cloned out of the graph's memory into the request's
   ``RequestState``, or, served through the scheduler, copied straight into the request's slot and
   pages of the state pool (``StateDestination.absorb``): the next replay overwrites them. The
   captured forward itself never writes into the pool (its addresses are another request's).

A layout is captured once it has been seen ``capture_after`` times (its first run is eager: it
autotunes the Triton kernels, which cannot happen inside a capture); up to ``max_graphs`` layouts
are kept, and a new one replaces the least-seen kept one only when it has been seen more often
(``CombineGraphs.note``), so one-off layouts (a new question length is a new layout) never make
the runner capture on every request. Each kept layout holds its forward's activations and the
spliced KV of every attention layer. Capture failures log once and turn the runner off; a request the graph
cannot serve (pairs of another dtype, fused scan off, cold segments) runs eagerly.

A model whose linear layers are not GDN (KDA, Mamba2, Lightning, short convolutions) runs their
chunked path, which reads the bodies' pairs from the entries: its graph reads them from staging
buffers that each replay refills (``combine_staging.StagedPairs``); the conv tails and attention
bodies still come by pointer.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from hypic_agent.kernels.config import KernelConfig
from hypic_agent.runtime.hypic.combine_inputs import CombineInputs
from hypic_agent.runtime.hypic.combine_staging import StagedPairs
from hypic_agent.runtime.hypic.entry import SegmentEntry
from hypic_agent.runtime.hypic.layout import CombineLayout
from hypic_agent.runtime.hypic.modes import ModeSpec
from hypic_agent.runtime.models.hybrid import HybridForCausalLM
from hypic_agent.runtime.runner.destination import StateDestination
from hypic_agent.runtime.state import RequestState

log = logging.getLogger(__name__)

# ``combine.forward_steps``: (model, lay, entries, spec, inputs, cold, every) -> None per step, then the state
ForwardSteps = Callable[..., Iterator[RequestState | None]]
# Layers per graph: the forward is captured as a few graphs replayed in order, so the GPU starts on
# the first while the host still launches the rest (one graph of a whole forward's kernels takes
# milliseconds to launch).
LAYERS_PER_GRAPH = 8
MAX_TRACKED = 1024  # layouts whose sightings are counted (least recently seen dropped first)
AGE_EVERY = 4096  # sightings between halvings of every count


@dataclass
class _Captured:
    graphs: list[torch.cuda.CUDAGraph]  # replayed in order (one memory pool)
    lay: CombineLayout  # the layout the graph reads (its tensors are the graph's inputs)
    inputs: CombineInputs
    out: RequestState  # in the graph's memory
    staged: StagedPairs | None = None  # the bodies' pairs it reads (None: by pointer, GDN)


class CombineGraphs:
    """Per (layout, mode, kernel choices) CUDA graphs of ``combine.forward_steps``; a runner's
    ``GraphSet.combines``."""

    def __init__(self, model: HybridForCausalLM, capture_after: int = 2, max_graphs: int = 4) -> None:
        self.model = model
        self.capture_after = capture_after
        self.max_graphs = max_graphs
        self.disabled: str | None = None  # why graphs are off (a capture failed), or None
        self.seen: collections.OrderedDict[tuple[Any, ...], int] = collections.OrderedDict()
        self.graphs: dict[tuple[Any, ...], _Captured] = {}
        self.replays = 0
        self._sightings = 0

    def key(
        self, lay: CombineLayout, spec: ModeSpec, fused_scan: bool | None, kernels: KernelConfig
    ) -> tuple[Any, ...]:
        """A graph per layout, mode, scan path and kernel choices (the scan kernel, its precision,
        the leading bodies' composition are in the captured forward)."""
        return (lay.shape_key, spec, fused_scan, kernels)

    def usable(self, lay: CombineLayout) -> bool:
        return self.disabled is None and self.capture_after > 0 and lay.active_ids.is_cuda and bool(lay.shape_key)

    def replay(
        self,
        lay: CombineLayout,
        entries: list[SegmentEntry | None],
        spec: ModeSpec,
        fused_scan: bool | None,
        kernels: KernelConfig,
        into: StateDestination | None = None,
    ) -> RequestState | None:
        """The request's state from its layout's graph, or None (no graph yet, or one it cannot use);
        ``into``: its layers are written into the pool (the state returned has none)."""
        if not self.usable(lay):
            return None
        key = self.key(lay, spec, fused_scan, kernels)
        cap = self.graphs.get(key)
        if cap is None:
            return None
        try:
            cap.inputs.refresh(self.model, lay, entries)
            if cap.staged is not None:
                cap.staged.fill(lay, entries)
        except ValueError as err:  # entries the graph cannot read (another dtype, another device)
            log.debug("combine graph skipped: %s", err)
            return None
        self.note(key)
        cap.lay.active_ids.copy_(lay.active_ids)
        for graph in cap.graphs:
            graph.replay()
        self.replays += 1
        out = cap.out.clone() if into is None else into.absorb(cap.out)
        out.length, out.tokens = lay.total, list(lay.tokens)
        return out

    def should_capture(
        self, lay: CombineLayout, spec: ModeSpec, fused_scan: bool | None, kernels: KernelConfig
    ) -> bool:
        """Count a sighting of this layout (one without a graph); True when it should be captured now."""
        return self.usable(lay) and self.note(self.key(lay, spec, fused_scan, kernels))

    def note(self, key: tuple[Any, ...]) -> bool:
        """Count a sighting of ``key``; whether to capture it now: seen ``capture_after`` times, and
        either a slot is free or it has been seen more often than the least-seen kept graph (which
        it then replaces). So layouts seen once or twice do not push out the ones traffic keeps
        hitting. Counts halve every ``AGE_EVERY`` sightings: a layout that stops coming loses its
        place."""
        n = self.seen.pop(key, 0) + 1
        self.seen[key] = n
        self._sightings += 1
        if self._sightings % AGE_EVERY == 0:
            for k in self.seen:
                self.seen[k] //= 2
        while len(self.seen) > MAX_TRACKED:
            self.seen.popitem(last=False)
        if n < self.capture_after or key in self.graphs:
            return False
        return len(self.graphs) < self.max_graphs or n > self.seen.get(self._victim(), 0)

    def _victim(self) -> tuple[Any, ...]:
        """The kept graph seen least often (the next to go)."""
        return min(self.graphs, key=lambda k: self.seen.get(k, 0))

    def capture(
        self,
        lay: CombineLayout,
        entries: list[SegmentEntry | None],
        spec: ModeSpec,
        fused_scan: bool | None,
        kernels: KernelConfig,
        inputs: CombineInputs,
        forward_steps: ForwardSteps,
        into: StateDestination | None = None,
        stage: bool = False,
    ) -> RequestState | None:
        """Capture ``forward_steps`` on ``inputs`` (planned for ``lay`` with ``kernels``) and replay it;
        None when the inputs are not all by pointer or the capture fails (the caller runs eagerly);
        ``into``: as in ``replay``; ``stage``: the linear layers' pairs come from staging buffers
        (``StagedPairs``; the chunked path of a non-GDN model), only the splice by pointer."""
        by_pointer = inputs.splice is not None if stage else inputs.by_pointer()
        if not by_pointer or not self.usable(lay):
            return None
        staged = StagedPairs.stage(lay, entries) if stage else None
        read = entries if staged is None else staged.entries
        dev = lay.active_ids.device
        graphs: list[torch.cuda.CUDAGraph] = []
        pool = torch.cuda.graph_pool_handle()
        try:
            torch.cuda.current_stream(dev).synchronize()  # the tables' host copies have landed
            # handed no stage graphs, its token-local stages are captured as they run (eagerly)
            steps = forward_steps(self.model, lay, read, spec, inputs, None, LAYERS_PER_GRAPH)
            out = None
            while out is None:
                graphs.append(torch.cuda.CUDAGraph())
                with torch.cuda.graph(graphs[-1], pool=pool, capture_error_mode="thread_local"):
                    out = next(steps)
        except Exception as err:  # never fail a request over a graph
            self.disabled = f"{type(err).__name__}: {err}"
            log.warning("CUDA graph capture of a combine forward failed (%s); running eagerly", self.disabled)
            return None
        while len(self.graphs) >= self.max_graphs:
            del self.graphs[self._victim()]
        self.graphs[self.key(lay, spec, fused_scan, kernels)] = _Captured(graphs, lay, inputs, out, staged)
        for graph in graphs:
            graph.replay()
        return out.clone() if into is None else into.absorb(out)
