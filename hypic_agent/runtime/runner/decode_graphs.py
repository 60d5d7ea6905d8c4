"""CUDA graphs of whole decode steps, one per batch-size bucket.

A decode step of a 40-layer MoE hybrid is several hundred small kernels: launched one by one from
Python the host takes tens of milliseconds while the GPU idles. Every input of a decode step is a
fixed-size tensor (token ids, positions, slots, KV rows, block table, context lengths), and every
op of the decode path updates the pool in place with no host sync, so the step from embedding to
logits is captured once per bucket and replayed: one launch per step.

Rows past the batch's real ones are padding: token 0 at position 0, the scratch slot 0 and the
scratch page 0, context length 0 (paged attention reads nothing for them). Their logits are
computed and never read. Capture happens on first use of a bucket, after one eager warm-up run
(Triton compiles outside the capture); a capture failure logs once and leaves decode eager.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from hypic_agent.runtime.runner.plan import ForwardPlan

if TYPE_CHECKING:
    from hypic_agent.runtime.models.hybrid import HybridForCausalLM
    from hypic_agent.runtime.runner.runner import ModelRunner

log = logging.getLogger(__name__)


def decode_buckets(max_batch: int) -> tuple[int, ...]:
    """1, 2, 4, 8, then steps of 8 to 64, then steps of 32: padding stays under ~1/8 of a batch."""
    small = [1, 2, 4, 8, *range(16, 65, 8), *range(96, 4097, 32)]
    out = [b for b in small if b < max_batch]
    return (*out, max_batch)


@contextlib.contextmanager
def graph_kernels(model: HybridForCausalLM) -> Iterator[None]:
    """The kernel choices of a captured step (warm-up and capture alike, so the fused kernels compile
    and tune before the capture): with ``graph_norms_fused`` the norms take the fused kernel at any
    row count. The model's own choices come back afterwards (eager forwards keep them)."""
    before = model.kernels
    if not before.graph_norms_fused:
        yield
        return
    model.set_kernels(dataclasses.replace(before, norm_fla_min_rows=0))
    try:
        yield
    finally:
        model.set_kernels(before)


class DecodeGraphs:
    def __init__(self, runner: ModelRunner, max_batch: int) -> None:
        self.runner = runner
        pool = runner.pool
        self.buckets = decode_buckets(max_batch)
        dev = pool.device
        b = self.buckets[-1]
        self.width = pool.max_seq_pages  # block-table columns: the longest sequence's pages
        self.ids = torch.zeros(b, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(b, dtype=torch.int64, device=dev)
        self.slots = torch.zeros(b, dtype=torch.int64, device=dev)
        self.rows = torch.zeros(b, dtype=torch.int64, device=dev)
        self.table = torch.zeros(b, self.width, dtype=torch.int32, device=dev)
        self.context_lens = torch.zeros(b, dtype=torch.int32, device=dev)
        self.last_rows = torch.arange(b, dtype=torch.int64, device=dev)
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._mempool: Any = None
        self.disabled: str | None = None
        self.replays = 0

    def bucket(self, n: int) -> int | None:
        return next((b for b in self.buckets if b >= n), None)

    def _plan(self, b: int) -> ForwardPlan:
        """The static decode plan over the first ``b`` rows of the buffers."""
        cu = torch.arange(b + 1, dtype=torch.int32)
        return ForwardPlan(
            seqs=(),
            new_tokens=(),
            decode_only=True,
            ids=self.ids[:b],
            positions=self.positions[:b],
            slots=self.slots[:b],
            rows=self.rows[:b],
            cu_seqlens=cu.to(self.ids.device),
            cu_host=cu,
            key_rows=self.rows[:0],
            cu_keys_host=cu,
            block_table=self.table[:b],
            context_lens=self.context_lens[:b],
            last_rows=self.last_rows[:b],
        )

    def run(self, plan: ForwardPlan) -> torch.Tensor:
        """Logits ``[N, vocab]`` of a decode-only plan (a view, valid until the next replay)."""
        n = len(plan.seqs)
        b = self.bucket(n)
        if b is None or self.disabled or plan.block_table.shape[1] > self.width:
            return self.runner.layers(plan)
        entry = self._graphs.get(b) or self._capture(b)  # before loading: capture runs padding rows only
        if entry is None:
            return self.runner.layers(plan)
        self._load(plan, n, b)
        graph, logits = entry
        graph.replay()
        self.replays += 1
        return logits[:n]

    def _load(self, plan: ForwardPlan, n: int, b: int) -> None:
        w = plan.block_table.shape[1]
        self.ids[:n].copy_(plan.ids)
        self.positions[:n].copy_(plan.positions)
        self.slots[:n].copy_(plan.slots)
        self.rows[:n].copy_(plan.rows)
        self.table[:n, :w].copy_(plan.block_table)
        self.context_lens[:n].copy_(plan.context_lens)
        if b > n:  # padding rows: scratch slot and page, nothing to attend over
            for t in (self.ids, self.positions, self.slots, self.rows, self.context_lens):
                t[n:b].zero_()

    def _capture(self, b: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor] | None:
        """Capture bucket ``b``. The warm-up run executes, so every row is padding then (scratch slot
        and page): no live request's state moves."""
        for t in (self.ids, self.positions, self.slots, self.rows, self.table, self.context_lens):
            t.zero_()
        dev = self.ids.device
        try:
            with graph_kernels(self.runner.model):
                side = torch.cuda.Stream(device=dev)
                side.wait_stream(torch.cuda.current_stream(dev))
                with torch.cuda.stream(side):  # warm-up outside the capture: compiles, workspaces
                    self.runner.layers(self._plan(b), eager=True)
                # NOTE: a fresh plan (new tensor views) for the capture: RoPE tables are cached per
                # positions tensor, and the warm-up's were computed outside the graph, from zeros
                plan = self._plan(b)
                torch.cuda.current_stream(dev).wait_stream(side)
                if self._mempool is None:
                    self._mempool = torch.cuda.graph_pool_handle()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self._mempool):
                    logits = self.runner.layers(plan, eager=True)
        except Exception as err:  # never fail a request over a graph
            self.disabled = f"{type(err).__name__}: {err}"
            log.warning("decode graph capture (batch %d) failed (%s); decoding eagerly", b, self.disabled)
            return None
        self._graphs[b] = (graph, logits)
        return self._graphs[b]
