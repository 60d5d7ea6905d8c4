"""CUDA graphs for the feed-forward halves of short forwards (combine, prefix continuation, decode).

A forward over a few hundred tokens is bound by the host: every layer's MoE block (router, top-k,
sort, grouped expert GEMMs, shared expert, residual) is some 35 small launches, each paying
Python and dispatcher time while the GPU idles (measured: 4.3 ms per layer of a Qwen3.5-35B-A3B
combine over 210 active tokens on an H200, against about 2 ms of GPU work). The feed-forward
block has only token-local shapes, so it is captured once per (layer, padded token count) and
replayed: one launch per layer. The mixers (conv, delta-rule scan, attention over spliced KV)
depend on the request's layout and stay eager.

Inputs are copied into a static ``[bucket, D]`` buffer; rows past the real tokens carry stale but
finite hidden states, are routed like any token and never read back. The real rows of the output
are copied out under a lock, so callers never hold a view of a buffer that the next replay (or
another thread sharing the model) overwrites. Capture failures (an op that syncs with the host, a
driver without graphs) log once and leave the runner eager.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import torch

from hypic_agent.runtime.models.hybrid import HybridForCausalLM

log = logging.getLogger(__name__)

BUCKETS = (8, 16, 32, 64, 128, 256, 512)


class FeedForwardGraphs:
    """Per-layer graphs of ``layer.feed_forward`` (``h + mlp(norm(h))``), keyed by bucket size."""

    def __init__(self, model: HybridForCausalLM, buckets: tuple[int, ...] = BUCKETS) -> None:
        self.model = model
        self.buckets = tuple(sorted(buckets))
        self.disabled: str | None = None  # why graphs are off (capture failed), or None
        self._inputs: dict[int, torch.Tensor] = {}  # bucket -> static input [b, D]
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._lock = threading.Lock()
        self._pool: Any = None  # one memory pool shared by all graphs (torch.cuda.graph_pool_handle)

    def bucket(self, n_tokens: int) -> int | None:
        """Smallest bucket holding ``n_tokens``, or None (too long: run eagerly)."""
        return next((b for b in self.buckets if b >= n_tokens), None)

    def __call__(self, li: int, h: torch.Tensor) -> torch.Tensor:
        """``model.layers[li].feed_forward(h)`` for h ``[T, D]``, replayed from a graph when it can be."""
        layer = self.model.layers[li]
        b = self.bucket(h.shape[0])
        if b is None or self.disabled or not h.is_cuda or torch.is_grad_enabled():
            return layer.feed_forward(h)
        entry = self._graphs.get((li, b))
        if entry is None:
            with self._lock:
                entry = self._graphs.get((li, b)) or self._capture(li, b, h)
        if entry is None:
            return layer.feed_forward(h)
        graph, out = entry
        with self._lock:
            self._inputs[b][: h.shape[0]].copy_(h)
            graph.replay()
            return out[: h.shape[0]].clone()

    def _capture(self, li: int, b: int, like: torch.Tensor) -> tuple[torch.cuda.CUDAGraph, torch.Tensor] | None:
        layer = self.model.layers[li]
        inp = self._inputs.get(b)
        if inp is None:
            inp = self._inputs[b] = torch.zeros(b, like.shape[1], device=like.device, dtype=like.dtype)
        try:
            side = torch.cuda.Stream(device=like.device)
            side.wait_stream(torch.cuda.current_stream(like.device))
            with torch.cuda.stream(side):  # warm-up outside the capture: lazy inits, workspaces
                for _ in range(2):
                    layer.feed_forward(inp)
            torch.cuda.current_stream(like.device).wait_stream(side)
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                out = layer.feed_forward(inp)
        except Exception as err:  # never fail a request over a graph
            self.disabled = f"{type(err).__name__}: {err}"
            log.warning("CUDA graph capture of the feed-forward block failed (%s); running eagerly", self.disabled)
            return None
        self._graphs[(li, b)] = (graph, out)
        return graph, out


def enable_cuda_graphs(model: HybridForCausalLM, buckets: tuple[int, ...] = BUCKETS) -> FeedForwardGraphs:
    """Attach a graph runner to ``model`` (used by ``feed_forward`` below); returns it."""
    runner = FeedForwardGraphs(model, buckets)
    model.ffn_graphs = runner
    return runner


def feed_forward(model: HybridForCausalLM, li: int, h: torch.Tensor) -> torch.Tensor:
    """Layer ``li``'s feed-forward half: through the model's graph runner if it has one."""
    runner = model.ffn_graphs
    if isinstance(runner, FeedForwardGraphs):
        return runner(li, h)
    return model.layers[li].feed_forward(h)
