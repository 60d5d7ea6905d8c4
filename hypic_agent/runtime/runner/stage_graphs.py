"""CUDA graphs for the token-local stages of short forwards (combine, prefix continuation, decode).

A forward over a few hundred tokens is bound by the host: every op pays Python and dispatcher time
while the GPU idles (a combine layer over a few hundred active tokens spends about twice its GPU
work in host time, measured on the H200, see docs/benchmarks.md; the MoE block alone is some 35
launches). The
stages that only have token-local shapes are captured once per (stage, layer, padded token count)
and replayed, one launch each:

* ``ffn``: the feed-forward half ``h + mlp(norm(h))`` (``DecoderLayer.feed_forward``);
* ``mixer_in``: input norm and the mixer's projections (``DecoderLayer.mixer_in``: GDN
  projections and gates, or attention q/k/v with their norms and the output gate);
* ``mixer_out``: the mixer's output projection, the residual and the feed-forward half
  (``DecoderLayer.mixer_out``).

What depends on the request's layout (conv over pieces, delta-rule scan over cached pairs,
attention over spliced KV) stays eager between ``mixer_in`` and ``mixer_out``.

Inputs are copied into static buffers; rows past the real tokens are zeros (rows a longer earlier
input left are cleared: stale hidden states would be routed to experts of their own), are
computed like any token and never read back. Outputs land in static buffers too (the graph
ends with the copy into them). Each buffer is sized for the largest bucket and shared by every
layer and every bucket of its stage (a bucket's graph works on the first ``bucket`` rows; replays
are serial), so the memory held by graphs grows with neither the layer count nor the number of
buckets: buckets up to 8192 tokens cover entry building of a few cold segments and the
prefix-cache continuation as well as the combine. By default the real rows are copied out under
a lock, so callers never hold a view of a buffer that the next replay (or another thread sharing
the model) overwrites. Capture failures (an op that syncs with the host, a driver without graphs)
log once and leave the runner eager.

Chained stages (``keep=True``, the combine forward): the hidden states' buffer is shared by
``mixer_in``'s input and ``mixer_out``'s input and output, and the output gate's (GDN ``z``, gated
attention's gate) by ``mixer_in``'s output and ``mixer_out``'s input. A stage run with ``keep``
returns views of its output buffers instead of copies, and an input that already is its buffer is
not copied, so a forward that hands each stage's views to the next moves no hidden state between
layers (otherwise hundreds of device copies per forward). The
views stay valid until the next replay of any stage: the caller must be done with them by then
(copy what it keeps) and must hold the runner to itself, one forward at a time.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import torch

from hypic_agent.kernels.config import DEFAULT_KERNELS
from hypic_agent.runtime.models.hybrid import HybridForCausalLM

log = logging.getLogger(__name__)


def bucket_sizes(
    step: int = DEFAULT_KERNELS.graph_bucket_step, max_tokens: int = DEFAULT_KERNELS.graph_max_tokens
) -> tuple[int, ...]:
    """Powers of two up to 512, steps of 512 up to 2,048, then steps of ``step`` up to 8,192
    (``KernelConfig.graph_bucket_step``), none above ``max_tokens`` (``KernelConfig.graph_max_tokens``).
    Padding rows are computed like real ones: a combine with 4 cold 1k segments (4,306 rows) padded
    to the next 512 ran 7% more token-local work (its expert GEMMs and projections) than it needed."""
    every = (8, 16, 32, 64, 128, 256, 512, 1024, 1536, *range(2048, 8192 + 1, step))
    return tuple(b for b in every if b <= max_tokens) or (8,)


Stage = Callable[..., tuple[torch.Tensor, ...]]
Input = torch.Tensor | tuple[torch.Tensor, ...]  # a tuple: parts stacked along rows
# buffers shared between stages (see module doc): (stage, slot) -> group; "out:" stages are outputs
_SHARED = {
    ("mixer_in", 0): "hidden",
    ("mixer_out", 0): "hidden",
    ("out:mixer_out", 0): "hidden",
    ("out:mixer_in", 1): "gate",  # GDN z
    ("out:mixer_in", 3): "gate",  # gated attention's gate
    ("mixer_out", 2): "gate",
}
_Graph = tuple[torch.cuda.CUDAGraph, list[torch.Tensor], tuple[torch.Tensor, ...]]


class LayerGraphs:
    """Per (stage, layer, bucket) graphs of token-local layer stages; ``buckets``: the padded token
    counts (None: ``bucket_sizes()``)."""

    def __init__(self, model: HybridForCausalLM, buckets: tuple[int, ...] | None = None) -> None:
        self.model = model
        self.buckets = tuple(sorted(bucket_sizes() if buckets is None else buckets))
        self.disabled: str | None = None  # why graphs are off (capture failed), or None
        self._inputs: dict[tuple[Any, ...], torch.Tensor] = {}  # (stage, slot, shape, dtype) -> buffer
        self._bases: dict[int, torch.Tensor] = {}  # data pointer -> that buffer (bucket views share it)
        self._live: dict[int, int] = {}  # data pointer -> leading rows that may be non-zero
        self._graphs: dict[tuple[str, int, int], _Graph] = {}
        self._lock = threading.Lock()
        self._pool: Any = None  # one memory pool shared by all graphs (torch.cuda.graph_pool_handle)

    def bucket(self, n_tokens: int) -> int | None:
        """Smallest bucket holding ``n_tokens``, or None (too long: run eagerly)."""
        return next((b for b in self.buckets if b >= n_tokens), None)

    def run(self, stage: str, li: int, fn: Stage, *xs: Input, keep: bool = False) -> tuple[torch.Tensor, ...]:
        """``fn(*xs)`` (token-local: row i of every output depends on row i of the inputs only), replayed
        from a graph when it can be. xs ``[T, ...]`` share T (a tuple input: parts stacked along rows).
        ``keep``: return views of the output buffers, valid until the next replay (module doc)."""
        parts = [x if isinstance(x, tuple) else (x,) for x in xs]
        first = parts[0][0]
        n = sum(p.shape[0] for p in parts[0])
        b = self.bucket(n)
        if b is None or self.disabled or not first.is_cuda or torch.is_grad_enabled():
            return fn(*(p[0] if len(p) == 1 else torch.cat(p) for p in parts))
        key = (stage, li, b)
        entry = self._graphs.get(key)
        if entry is None:
            with self._lock:
                entry = self._graphs.get(key) or self._capture(key, fn, parts)
        if entry is None:
            return fn(*(p[0] if len(p) == 1 else torch.cat(p) for p in parts))
        graph, inputs, outputs = entry
        with self._lock:
            for buf, x in zip(inputs, parts, strict=True):
                self._load(buf, x)
            graph.replay()
            for o in outputs:  # the graph wrote all b rows of its outputs (shared ones are inputs too)
                self._live[o.data_ptr()] = max(self._live.get(o.data_ptr(), 0), b)
            if keep:
                return tuple(o[:n] for o in outputs)
            return tuple(o[:n].clone() for o in outputs)

    def _load(self, buf: torch.Tensor, parts: tuple[torch.Tensor, ...]) -> None:
        """Copy ``parts`` (stacked: ``[n, ...]``) into the first rows of the input buffer ``buf`` and
        zero the rows a longer earlier input left behind, so padding rows hold zeros rather than stale
        hidden states: a stale row is routed to experts like a real token (more expert weights to
        read), while zero rows all pick the same top-k. Only rows written since the last zeroing are
        cleared, so same-size requests pay nothing. An input that already is the buffer's first
        rows (a chained stage's view) is left in place."""
        n = sum(x.shape[0] for x in parts)
        x0 = parts[0]
        if len(parts) == 1 and x0.data_ptr() == buf.data_ptr() and x0.shape[1:] == buf.shape[1:] and x0.is_contiguous():
            return  # already there: its padding rows were written by the graph that made it
        row = 0
        for x in parts:
            buf[row : row + x.shape[0]].copy_(x)
            row += x.shape[0]
        base = self._bases.get(buf.data_ptr(), buf)
        live = self._live.get(buf.data_ptr(), 0)
        if live > n:
            base[n:live].zero_()
        self._live[buf.data_ptr()] = n

    def _buffers(self, stage: str, b: int, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        """``[b, ...]`` views of static buffers shaped like ``xs`` (rows past the first dim), one per
        (stage or ``_SHARED`` group, slot, shape, dtype) with the largest bucket's rows: shared by all
        layers and buckets (and by the stages of a group). Two slots of one stage never share."""
        bufs: list[torch.Tensor] = []
        for slot, x in enumerate(xs):
            group = _SHARED.get((stage, slot))
            key: tuple[Any, ...] = (group or (stage, slot), tuple(x.shape[1:]), x.dtype)
            if key not in self._inputs:
                base = torch.zeros(self.buckets[-1], *x.shape[1:], device=x.device, dtype=x.dtype)
                self._inputs[key] = self._bases[base.data_ptr()] = base
            buf = self._inputs[key][:b]
            if any(buf.data_ptr() == other.data_ptr() for other in bufs):  # same shape in one stage
                return self._buffers(stage + "#", b, xs)  # no group matches: one buffer per slot
            bufs.append(buf)
        return bufs

    def _capture(self, key: tuple[str, int, int], fn: Stage, parts: list[tuple[torch.Tensor, ...]]) -> _Graph | None:
        inputs = self._buffers(key[0], key[2], [p[0] for p in parts])
        dev = inputs[0].device
        try:
            side = torch.cuda.Stream(device=dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):  # warm-up outside the capture: lazy inits, workspaces
                for _ in range(2):
                    sample = fn(*inputs)
            torch.cuda.current_stream(dev).wait_stream(side)
            outputs = tuple(self._buffers("out:" + key[0], key[2], list(sample)))
            del sample
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                for buf, y in zip(outputs, fn(*inputs), strict=True):
                    buf.copy_(y)
        except Exception as err:  # never fail a request over a graph
            self.disabled = f"{type(err).__name__}: {err}"
            log.warning("CUDA graph capture of stage %r failed (%s); running eagerly", key[0], self.disabled)
            return None
        self._graphs[key] = (graph, inputs, outputs)
        return self._graphs[key]


def feed_forward(model: HybridForCausalLM, li: int, h: torch.Tensor, graphs: LayerGraphs | None = None) -> torch.Tensor:
    """Layer ``li``'s feed-forward half ``[T, D] -> [T, D]``, replayed from ``graphs`` where it can be."""
    layer = model.layers[li]
    if graphs is None or layer.mlp is None:  # a layer without a feed-forward half returns h itself
        return layer.feed_forward(h)
    return graphs.run("ffn", li, lambda x: (layer.feed_forward(x),), h)[0]


def mixer_in(
    model: HybridForCausalLM, li: int, h: torch.Tensor, graphs: LayerGraphs | None = None, *, keep: bool = False
) -> tuple[torch.Tensor, ...]:
    """Layer ``li``'s ``DecoderLayer.mixer_in(h)``, replayed from ``graphs`` where it can be; ``keep``:
    chained (views, see module doc)."""
    layer = model.layers[li]
    if graphs is None:
        return layer.mixer_in(h)
    return graphs.run("mixer_in", li, layer.mixer_in, h, keep=keep)


def mixer_out(
    model: HybridForCausalLM,
    li: int,
    h: torch.Tensor,
    o: Input,
    *extra: torch.Tensor,
    graphs: LayerGraphs | None = None,
    keep: bool = False,
) -> torch.Tensor:
    """Layer ``li``'s ``DecoderLayer.mixer_out(h, o, *extra)`` -> the next hidden states ``[T, D]``;
    ``o`` may come in row parts (stacked, into the graph's buffer without a ``cat``); ``keep``:
    chained (a view, see module doc)."""
    layer = model.layers[li]
    if graphs is None:
        return layer.mixer_out(h, o if isinstance(o, torch.Tensor) else torch.cat(o), *extra)
    return graphs.run("mixer_out", li, lambda *xs: (layer.mixer_out(*xs),), h, o, *extra, keep=keep)[0]
