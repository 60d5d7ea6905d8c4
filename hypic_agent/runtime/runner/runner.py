"""``ModelRunner``: owns the model's weights, every CUDA graph (``GraphSet``: token-local stages,
whole combines, cold cores; and once it serves a state pool, the decode steps) and runs any
``ForwardPlan`` (decode rows, prefill chunks, composed requests' combines, cold builds) through the
ONE layer loop (``layer_loop.layer_steps``) that dispatches each layer to its mixer kind.

The token-local stages (``mixer_in``: norm + projections; ``mixer_out``: output projection,
residual, feed-forward) are the layer's own; what depends on the plan (which slots, which pages,
decode or extend) is in ``mixers.py``, a combine's work in ``hypic.combine_work``. Decode-only plans
replay from CUDA graphs per batch-size bucket on CUDA (``decode_graphs.DecodeGraphs``); everything
else runs eagerly (its token-local stages still replay from ``runner.stage_graphs`` per token-count
bucket).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from hypic_agent.runtime.hypic.combine import combine
from hypic_agent.runtime.models.hybrid import HybridForCausalLM
from hypic_agent.runtime.runner.decode_graphs import DecodeGraphs
from hypic_agent.runtime.runner.graph_set import GraphSet
from hypic_agent.runtime.runner.layer_loop import run_layers
from hypic_agent.runtime.runner.plan import ForwardPlan, RowSnapshot, plan_forward
from hypic_agent.runtime.runner.pool import PoolSeq, StatePool

if TYPE_CHECKING:
    from hypic_agent.runtime.hypic.build import ColdBatch
    from hypic_agent.runtime.hypic.combine_work import CombineWork


class ModelRunner:
    def __init__(
        self,
        model: HybridForCausalLM,
        pool: StatePool | None = None,
        *,
        graphs: GraphSet | None = None,
        decode_graphs: bool = False,
        max_batch: int = 128,
    ) -> None:
        """``pool``: the state pool it serves (None: forwards without pool rows only, until ``attach``);
        ``graphs``: the stage / combine / cold graphs its forwards replay (None: none)."""
        self.model = model
        self.graphs = graphs if graphs is not None else GraphSet()
        self._pool: StatePool | None = None
        self.decode_graphs: DecodeGraphs | None = None
        if pool is not None:
            self.attach(pool, decode_graphs=decode_graphs, max_batch=max_batch)

    def attach(self, pool: StatePool, *, decode_graphs: bool = False, max_batch: int = 128) -> None:
        """Serve ``pool``; ``decode_graphs``: capture whole decode steps per batch bucket (CUDA only)."""
        if self._pool is not None:
            raise RuntimeError("this runner serves a state pool already")
        self._pool = pool
        if decode_graphs and pool.device.type == "cuda":
            self.decode_graphs = DecodeGraphs(self, min(max_batch, pool.n_slots))

    @property
    def pool(self) -> StatePool:
        if self._pool is None:
            raise RuntimeError("this runner serves no state pool (ModelRunner.attach)")
        return self._pool

    @property
    def paged_decode(self) -> bool:
        """Decode attends through the block table (the paged Triton kernel): on CUDA."""
        return self.pool.device.type == "cuda"

    def plan(
        self,
        seqs: Sequence[PoolSeq],
        new_tokens: Sequence[Sequence[int]],
        combines: Sequence[CombineWork] = (),
        colds: Sequence[ColdBatch] = (),
        snapshots: Sequence[RowSnapshot] = (),
    ) -> ForwardPlan:
        """The ``ForwardPlan`` of one step (``plan.plan_forward`` for this runner's decode path)."""
        return plan_forward(
            self.pool, seqs, new_tokens, paged=self.paged_decode, combines=combines, colds=colds, snapshots=snapshots
        )

    @torch.no_grad()
    def forward(self, plan: ForwardPlan) -> torch.Tensor:
        """Run ``plan``; returns the logits of each sequence's last new token, then of each combine's
        last active row ``[N_seqs + N_combines, vocab]`` (fp32), and advances every sequence's length
        and tokens (a combine's destination is committed by its owner)."""
        if plan.decode_only and plan.pool_only and self.decode_graphs is not None:
            logits = self.decode_graphs.run(plan)
        elif self._lone_combine(plan):
            w = plan.combines[0]
            state = combine(
                self.model, w.lay, w.entries, w.spec, kernels=self.model.kernels, into=w.into, graphs=self.graphs
            )
            assert state.last_logits is not None
            logits = state.last_logits[None]
        else:
            logits = self.layers(plan)
        for s, toks in zip(plan.seqs, plan.new_tokens, strict=True):
            s.length += len(toks)
            s.tokens.extend(toks)
        return logits

    def _lone_combine(self, plan: ForwardPlan) -> bool:
        """A step of one combine and nothing else, with combine graphs: the whole forward may replay
        from its layout's graph (``combine_graphs``; else it runs as any plan does, eagerly)."""
        return self.graphs.combines is not None and len(plan.combines) == 1 and not plan.colds and not plan.n_tokens

    def layers(self, plan: ForwardPlan, *, eager: bool = False) -> torch.Tensor:
        """The layer loop (``layer_loop``): embed -> (mixer_in, each group's mixer, mixer_out) per layer
        -> logits of the last rows. ``eager``: replay no stage graph (inside a capture)."""
        return run_layers(self.model, plan, self._pool, None if eager else self.graphs.stages)
