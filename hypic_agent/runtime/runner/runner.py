"""``ModelRunner``: owns the model's weights, the state pool and the decode graphs, and runs any
``ForwardPlan`` through ONE layer loop that dispatches each layer to its mixer kind.

The token-local stages (``mixer_in``: norm + projections; ``mixer_out``: output projection,
residual, feed-forward) are the layer's own; what depends on the plan (which slots, which pages,
decode or extend) is in ``mixers.py``. Decode-only plans replay from CUDA graphs per batch-size
bucket on CUDA (``decode_graphs.DecodeGraphs``); everything else runs eagerly (its token-local
stages still replay from ``runtime.graphs`` per token-count bucket).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hypic_agent.runtime.graphs import mixer_in, mixer_out
from hypic_agent.runtime.models.hybrid import HybridForCausalLM
from hypic_agent.runtime.runner.mixers import attention_mix, linear_mix
from hypic_agent.runtime.runner.plan import ForwardPlan, plan_forward
from hypic_agent.runtime.runner.pool import PoolSeq, StatePool


class ModelRunner:
    def __init__(self, model: HybridForCausalLM, pool: StatePool, *, decode_graphs: bool = False, max_batch: int = 128):
        self.model = model
        self.pool = pool
        self.decode_graphs = None
        if decode_graphs and pool.device.type == "cuda":
            from hypic_agent.runtime.runner.decode_graphs import DecodeGraphs

            self.decode_graphs = DecodeGraphs(self, min(max_batch, pool.n_slots))

    @property
    def paged_decode(self) -> bool:
        """Decode attends through the block table (the paged Triton kernel): on CUDA."""
        return self.pool.device.type == "cuda"

    def plan(self, seqs: Sequence[PoolSeq], new_tokens: Sequence[Sequence[int]]) -> ForwardPlan:
        """The ``ForwardPlan`` of one step (``plan.plan_forward`` for this runner's decode path)."""
        return plan_forward(self.pool, seqs, new_tokens, paged=self.paged_decode)

    @torch.no_grad()
    def forward(self, plan: ForwardPlan) -> torch.Tensor:
        """Run ``plan``; returns the logits of each sequence's last new token ``[N, vocab]`` (fp32) and
        advances every sequence's length and tokens."""
        if plan.decode_only and self.decode_graphs is not None:
            logits = self.decode_graphs.run(plan)
        else:
            logits = self.layers(plan)
        for s, toks in zip(plan.seqs, plan.new_tokens, strict=True):
            s.length += len(toks)
            s.tokens.extend(toks)
        return logits

    def layers(self, plan: ForwardPlan) -> torch.Tensor:
        """The layer loop: embed -> (mixer_in, mixer, mixer_out) per layer -> logits of the last rows."""
        model = self.model
        h = model.embed(plan.ids)
        for li, layer in enumerate(model.layers):
            inputs = mixer_in(model, li, h)
            if layer.linear_attn is not None:
                o, extra = linear_mix(layer.linear_attn, self.pool, li, inputs, plan)
            else:
                assert layer.self_attn is not None
                o, extra = attention_mix(layer.self_attn, self.pool, li, inputs, plan)
            h = mixer_out(model, li, h, o, *extra)
        return model.logits(h.index_select(0, plan.last_rows))
