"""The layer loop: every forward of the runtime, any mix of work, through one pass over the layers.

A ``ForwardPlan``'s rows come in groups, stacked in this order:

1. cold builds (``plan.colds``: ``ColdBatch``es, segments prefilled in isolation into entries);
2. pool rows (``plan.seqs``: decode tokens and prefill chunks of requests in the state pool);
3. combines (``plan.combines``: ``CombineWork``, composed requests' active rows over their entries).

Per layer the token-local stages (``mixer_in``: norm + projections; ``mixer_out``: output
projection, residual, feed-forward) run once over all rows, so the weights are read once per layer
for the whole step (for an MoE model most of a step's time); in between each group runs its own
mixer work on its rows (``ColdBatch.run_layer``, ``mixers.linear_mix`` / ``attention_mix`` over the
pool, ``CombineWork.mix``; consecutive combines that read their entries by pointer as one
``CombineGroup``: one linear-layer launch set and one rotation for all of them). The logits are those
of each pool sequence's last new row (every pool row with ``all_logits``), then of each combine's last
active row.

Measurements and streams look inside through hooks instead of loops of their own: ``hidden(li, h)``
sees the residual stream entering layer ``li`` (``li == n_layers``: after the last; ``hypic.probe``,
``hypic.blend``), ``mixed(li)`` runs once every group's mixer work of layer ``li`` is queued (a
worker streams a finished layer group from there: ``workers.stream``), and ``n_layers`` stops early
(``hypic.blend_scout``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from hypic_agent.runtime.hypic.combine_group import CombineGroup, group_works
from hypic_agent.runtime.hypic.combine_work import CombineWork
from hypic_agent.runtime.models.hybrid import HybridForCausalLM
from hypic_agent.runtime.models.layers.gated_deltanet import GatedDeltaNet
from hypic_agent.runtime.runner.mixers import attention_mix, linear_mix
from hypic_agent.runtime.runner.plan import ForwardPlan
from hypic_agent.runtime.runner.pool import StatePool
from hypic_agent.runtime.runner.stage_graphs import LayerGraphs, mixer_in, mixer_out


def _rows(xs: tuple[torch.Tensor, ...], a: int, b: int) -> tuple[torch.Tensor, ...]:
    return tuple(x[a:b] for x in xs)


def last_hidden(h: torch.Tensor, plan: ForwardPlan, all_logits: bool = False) -> torch.Tensor:
    """``[N_seqs + N_combines, D]`` the rows of ``h`` whose logits the forward returns: each pool
    sequence's last new row (``all_logits``: every pool row), then each combine's last active row
    (device ops only: a CUDA graph of the forward captures this too)."""
    if plan.pool_only and not all_logits:
        return h.index_select(0, plan.last_rows)
    a = sum(c.n_tokens for c in plan.colds)
    parts = []
    if plan.n_tokens:
        pool_rows = h[a : a + plan.n_tokens]
        parts.append(pool_rows if all_logits else pool_rows.index_select(0, plan.last_rows))
        a += plan.n_tokens
    for w in plan.combines:
        a += w.n_rows
        parts.append(h[a - 1 : a])
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def layer_steps(
    model: HybridForCausalLM,
    plan: ForwardPlan,
    pool: StatePool | None,
    *,
    every: int = 0,
    stages: LayerGraphs | None = None,
    all_logits: bool = False,
    n_layers: int | None = None,
    hidden: Callable[[int, torch.Tensor], None] | None = None,
    mixed: Callable[[int], None] | None = None,
) -> Iterator[torch.Tensor | None]:
    """Run ``plan`` (see module doc); yields None after every ``every`` layers (0: never; how a CUDA
    graph of the forward is captured in a few pieces), then the logits ``[N_seqs + N_combines,
    vocab]``. ``pool``: the state pool the plan's sequences live in (None when it has none);
    ``stages``: the token-local stages' graphs to replay (None: eager, as inside a capture);
    ``all_logits``: every pool row's logits; ``n_layers``, ``hidden``, ``mixed``: the hooks (module
    doc; ``hidden`` gets the stream itself, which a stage graph may overwrite: copy what is kept)."""
    if plan.n_tokens and pool is None:
        raise ValueError("a plan with pool rows needs the state pool")
    parts = [c.embed() for c in plan.colds]
    if plan.n_tokens:
        parts.append(model.embed(plan.ids))
    parts += [model.embed(w.lay.active_ids) for w in plan.combines]
    if not parts:
        raise ValueError("an empty forward plan")
    h = parts[0] if len(parts) == 1 else torch.cat(parts)
    layers = model.layers if n_layers is None else model.layers[:n_layers]
    units: list[CombineWork | CombineGroup] = []
    for li, layer in enumerate(layers):
        if every and li and li % every == 0:
            yield None
        if hidden is not None:
            hidden(li, h)
        # chained stages (views of the stage graphs' buffers, valid until the next stage: module doc
        # of ``runner.stage_graphs``); every group below is done with them before ``mixer_out``
        xs = mixer_in(model, li, h, stages, keep=True)
        outs: list[torch.Tensor] = []
        a = 0
        for c in plan.colds:
            outs.append(c.run_layer(li, layer, _rows(xs, a, a + c.n_tokens))[0])
            a += c.n_tokens
        if li == 0:  # the combines' tables are planned while the GPU runs the cold rows' first layer
            for w in plan.combines:
                w.plan()
            units = group_works(plan.combines)
        if plan.n_tokens:
            assert pool is not None
            mine = _rows(xs, a, a + plan.n_tokens)
            if layer.linear_attn is not None:
                o, _ = linear_mix(layer.linear_attn, pool, li, mine, plan)
            else:
                assert layer.self_attn is not None
                o, _ = attention_mix(layer.self_attn, pool, li, mine, plan)
            outs.append(o)
            a += plan.n_tokens
        for u in units:
            if isinstance(u, CombineWork):
                outs.append(u.mix(li, layer, _rows(xs, a, a + u.n_rows)))
            elif isinstance(layer.linear_attn, GatedDeltaNet):
                outs.append(u.mix_linear(li, layer.linear_attn, _rows(xs, a, a + u.n_rows)))
            else:
                outs += u.mix_attention(li, layer, _rows(xs, a, a + u.n_rows))
            a += u.n_rows
        if mixed is not None:
            mixed(li)
        extra = xs[1:2] if layer.linear_attn is not None else xs[3:]  # GDN's z / the attention gate, if any
        h = mixer_out(model, li, h, outs[0] if len(outs) == 1 else tuple(outs), *extra, graphs=stages, keep=True)
    if hidden is not None:
        hidden(len(layers), h)
    if not plan.n_tokens and not plan.combines:  # cold builds only: nothing to predict
        yield h.new_empty(0, model.config.vocab_size)
        return
    yield model.logits(last_hidden(h, plan, all_logits))


def run_layers(
    model: HybridForCausalLM,
    plan: ForwardPlan,
    pool: StatePool | None,
    stages: LayerGraphs | None = None,
    **hooks: Any,
) -> torch.Tensor:
    """``layer_steps`` to the end: the logits (``hooks``: ``all_logits``, ``n_layers``, ``hidden``,
    ``mixed``)."""
    *_, logits = layer_steps(model, plan, pool, stages=stages, **hooks)
    assert logits is not None
    return logits
