"""CUDA graphs for the token-local stages of short forwards (combine, prefix continuation, decode).

A forward over a few hundred tokens is bound by the host: every op pays Python and dispatcher time
while the GPU idles (measured: 4.3 ms per layer of a Qwen3.5-35B-A3B combine over 210 active
tokens on an H200, against about 2 ms of GPU work; the MoE block alone is some 35 launches). The
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
prefix-cache continuation as well as the combine. The real
rows are copied out under a lock, so callers never hold a view of a buffer that the next replay (or
another thread sharing the model) overwrites. Capture failures (an op that syncs with the host, a
driver without graphs) log once and leave the runner eager.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from hypic_agent.runtime.models.hybrid import HybridForCausalLM

log = logging.getLogger(__name__)


def bucket_sizes(step: int = 128) -> tuple[int, ...]:
    """Powers of two up to 512, steps of 512 up to 2,048, then steps of ``step`` up to 8,192. Padding
    rows are computed like real ones: a combine with 4 cold 1k segments (4,306 rows) padded to the
    next 512 ran 7% more token-local work (its expert GEMMs and projections) than it needed."""
    return (8, 16, 32, 64, 128, 256, 512, 1024, 1536, *range(2048, 8192 + 1, step))


BUCKETS = bucket_sizes()
Stage = Callable[..., tuple[torch.Tensor, ...]]
_Graph = tuple[torch.cuda.CUDAGraph, list[torch.Tensor], tuple[torch.Tensor, ...]]


class LayerGraphs:
    """Per (stage, layer, bucket) graphs of token-local layer stages."""

    def __init__(self, model: HybridForCausalLM, buckets: tuple[int, ...] | None = None) -> None:
        self.model = model
        self.buckets = tuple(sorted(BUCKETS if buckets is None else buckets))
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

    def run(self, stage: str, li: int, fn: Stage, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``fn(*xs)`` (token-local: row i of every output depends on row i of the inputs only), replayed
        from a graph when it can be. xs ``[T, ...]`` share T."""
        n = xs[0].shape[0]
        b = self.bucket(n)
        if b is None or self.disabled or not xs[0].is_cuda or torch.is_grad_enabled():
            return fn(*xs)
        key = (stage, li, b)
        entry = self._graphs.get(key)
        if entry is None:
            with self._lock:
                entry = self._graphs.get(key) or self._capture(key, fn, xs)
        if entry is None:
            return fn(*xs)
        graph, inputs, outputs = entry
        with self._lock:
            for buf, x in zip(inputs, xs, strict=True):
                self._load(buf, x)
            graph.replay()
            return tuple(o[:n].clone() for o in outputs)

    def _load(self, buf: torch.Tensor, x: torch.Tensor) -> None:
        """Copy ``x [n, ...]`` into the first rows of the input buffer ``buf`` and zero the rows a longer
        earlier input left behind, so padding rows hold zeros rather than stale hidden states: a
        stale row is routed to experts like a real token (more expert weights to read), while zero
        rows all pick the same top-k. Only rows written since the last zeroing are cleared, so
        same-size requests pay nothing."""
        n = x.shape[0]
        buf[:n].copy_(x)
        base = self._bases.get(buf.data_ptr(), buf)
        live = self._live.get(buf.data_ptr(), 0)
        if live > n:
            base[n:live].zero_()
        self._live[buf.data_ptr()] = n

    def _buffers(self, stage: str, b: int, xs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
        """``[b, ...]`` views of static buffers shaped like ``xs`` (rows past the first dim), one per
        (stage, slot, shape, dtype) with the largest bucket's rows: shared by all layers and buckets."""
        bufs = []
        for slot, x in enumerate(xs):
            key = (stage, slot, tuple(x.shape[1:]), x.dtype)
            if key not in self._inputs:
                base = torch.zeros(self.buckets[-1], *x.shape[1:], device=x.device, dtype=x.dtype)
                self._inputs[key] = self._bases[base.data_ptr()] = base
            bufs.append(self._inputs[key][:b])
        return bufs

    def _capture(self, key: tuple[str, int, int], fn: Stage, xs: tuple[torch.Tensor, ...]) -> _Graph | None:
        inputs = self._buffers(key[0], key[2], xs)
        dev = xs[0].device
        try:
            side = torch.cuda.Stream(device=dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):  # warm-up outside the capture: lazy inits, workspaces
                for _ in range(2):
                    sample = fn(*inputs)
            torch.cuda.current_stream(dev).wait_stream(side)
            outputs = tuple(self._buffers("out:" + key[0], key[2], sample))
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


def enable_cuda_graphs(model: HybridForCausalLM, buckets: tuple[int, ...] | None = None) -> LayerGraphs:
    """Attach a graph runner to ``model`` (used by the stage functions below); returns it."""
    runner = LayerGraphs(model, buckets)
    model.ffn_graphs = runner
    return runner


_EAGER = threading.local()  # set while this thread captures a bigger graph (no replay inside a capture)


@contextlib.contextmanager
def eager_stages() -> Iterator[None]:
    """Within this context the stage functions below run eagerly in this thread (how a CUDA graph
    of a whole forward, ``hypic.combine_graphs``, captures them)."""
    before = getattr(_EAGER, "on", False)
    _EAGER.on = True
    try:
        yield
    finally:
        _EAGER.on = before


def _runner(model: HybridForCausalLM) -> LayerGraphs | None:
    runner = model.ffn_graphs
    if getattr(_EAGER, "on", False):
        return None
    return runner if isinstance(runner, LayerGraphs) else None


def feed_forward(model: HybridForCausalLM, li: int, h: torch.Tensor) -> torch.Tensor:
    """Layer ``li``'s feed-forward half ``[T, D] -> [T, D]``."""
    layer = model.layers[li]
    runner = _runner(model)
    if runner is None:
        return layer.feed_forward(h)
    return runner.run("ffn", li, lambda x: (layer.feed_forward(x),), h)[0]


def mixer_in(model: HybridForCausalLM, li: int, h: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Layer ``li``'s ``DecoderLayer.mixer_in(h)``."""
    layer = model.layers[li]
    runner = _runner(model)
    if runner is None:
        return layer.mixer_in(h)
    return runner.run("mixer_in", li, layer.mixer_in, h)


def mixer_out(
    model: HybridForCausalLM, li: int, h: torch.Tensor, o: torch.Tensor, *extra: torch.Tensor
) -> torch.Tensor:
    """Layer ``li``'s ``DecoderLayer.mixer_out(h, o, *extra)`` -> the next hidden states ``[T, D]``."""
    layer = model.layers[li]
    runner = _runner(model)
    if runner is None:
        return layer.mixer_out(h, o, *extra)
    return runner.run("mixer_out", li, lambda *xs: (layer.mixer_out(*xs),), h, o, *extra)[0]
