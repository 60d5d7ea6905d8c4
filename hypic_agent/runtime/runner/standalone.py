"""Standalone forwards over ``RequestState``s, through the runner's one layer loop.

Measurements, the engine's one-request prepare and the benchmarks run whole prompts outside the
scheduler: ``prefill`` packs N sequences (each continuing from a prior ``RequestState`` or from
nothing) as the pool rows of one ``ForwardPlan`` over a state pool sized for them, and hands back
new standalone states; ``decode_step`` advances states by one token the same way. Both go through
``layer_loop`` (the scheduler's forward), so there is no second implementation of the model to keep
in step; the plain reference forward lives with the tests (``tests/runtime/reference.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hypic_agent.runtime.models.hybrid import HybridForCausalLM
from hypic_agent.runtime.runner.layer_loop import run_layers
from hypic_agent.runtime.runner.plan import plan_forward
from hypic_agent.runtime.runner.pool import PoolSeq, StatePool
from hypic_agent.runtime.runner.stage_graphs import LayerGraphs
from hypic_agent.runtime.state import RequestState

PAGE = 16  # rows per page of the temporary pool (any size works; small keeps the padding small)


def _pool(
    model: HybridForCausalLM, prior: Sequence[RequestState | None], lengths: Sequence[int]
) -> tuple[StatePool, list[PoolSeq]]:
    """A state pool holding ``prior[i]`` in slot i, with pages for ``lengths[i]`` tokens."""
    p = next(model.parameters())
    pages = sum(-(-max(n, 1) // PAGE) for n in lengths)
    pool = StatePool(
        model.config, slots=len(lengths), kv_tokens=pages * PAGE, page_size=PAGE, device=p.device, dtype=p.dtype
    )
    seqs = []
    for st, n in zip(prior, lengths, strict=True):
        seq = pool.alloc(n)
        assert seq is not None
        if st is not None and st.length:
            pool.load(seq, st)
        seqs.append(seq)
    return pool, seqs


@torch.no_grad()
def prefill(
    model: HybridForCausalLM,
    seqs: Sequence[Sequence[int]],
    states: Sequence[RequestState | None] | None = None,
    *,
    all_logits: bool = False,
    graphs: LayerGraphs | None = None,
) -> list[RequestState]:
    """Prefill N sequences as one packed forward, each continuing from ``states[i]`` (or empty).

    Returns new ``RequestState`` objects (the inputs are not modified) with ``last_logits``; with
    ``all_logits`` they also carry ``all_logits [L_i, vocab]`` (an attribute). ``graphs``: the
    token-local stages' graphs to replay (None: eager)."""
    if not seqs or any(len(s) == 0 for s in seqs):
        raise ValueError("prefill needs at least one non-empty sequence")
    prior = list(states) if states is not None else [None] * len(seqs)
    lengths = [(st.length if st is not None else 0) + len(s) for st, s in zip(prior, seqs, strict=True)]
    pool, pooled = _pool(model, prior, lengths)
    plan = plan_forward(pool, pooled, seqs)
    logits = run_layers(model, plan, pool, graphs, all_logits=all_logits)
    bounds = plan.cu_host.tolist()
    out = []
    for j, (seq, st) in enumerate(zip(pooled, prior, strict=True)):
        seq.length = lengths[j]
        seq.tokens = (list(st.tokens) if st is not None else []) + [int(t) for t in seqs[j]]
        ns = pool.export(seq)
        if all_logits:
            a, b = bounds[j], bounds[j + 1]
            ns.last_logits = logits[b - 1]
            ns.all_logits = logits[a:b]  # type: ignore[attr-defined]
        else:
            ns.last_logits = logits[j]
        out.append(ns)
    return out


@torch.no_grad()
def decode_step(model: HybridForCausalLM, states: Sequence[RequestState], tokens: Sequence[int]) -> None:
    """Advance each state by one token in place; sets ``last_logits``."""
    new = prefill(model, [[int(t)] for t in tokens], states)
    for st, ns in zip(states, new, strict=True):
        st.layers, st.length, st.tokens, st.last_logits = ns.layers, ns.length, ns.tokens, ns.last_logits
