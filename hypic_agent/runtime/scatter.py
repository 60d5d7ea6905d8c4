"""Scatter: prefill cold segments into entries, spread over workers by LPT.

In-process, the single worker builds all cold segments as one packed varlen batch (attention
cost is the sum of |C|^2 and every pair comes out of the same pass). Each LPT group is one
packed batch, so with several workers each one's batch runs on its own device.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hypic_agent.runtime.hypic.build import build_entries
from hypic_agent.runtime.hypic.entry import SegmentEntry
from hypic_agent.runtime.models.hybrid import HybridForCausalLM
from hypic_agent.runtime.router import lpt_assign
from hypic_agent.runtime.runner.graph_set import GraphSet


def scatter_prefill(
    models: Sequence[HybridForCausalLM],
    segments: Sequence[Sequence[int]],
    seams: Sequence[int],
    *,
    pair_dtype: torch.dtype = torch.float32,
    max_batch_tokens: int = 65536,
    prefix: Sequence[int] = (),
    graphs: GraphSet | None = None,
) -> list[SegmentEntry]:
    """Build entries for ``segments`` on the workers' model replicas; result in input order.
    ``prefix``: the build context's tokens, ``graphs``: the first replica's runner graphs
    (``build_entries``)."""
    if not segments:
        return []
    groups = lpt_assign([float(len(s)) for s in segments], len(models))
    out: list[SegmentEntry | None] = [None] * len(segments)
    home = next(models[0].parameters()).device
    for model, group in zip(models, groups, strict=True):
        for batch in _batches(group, [len(s) for s in segments], max_batch_tokens):
            segs, ws = [segments[i] for i in batch], [seams[i] for i in batch]
            own = graphs if model is models[0] else None
            built = build_entries(model, segs, ws, pair_dtype=pair_dtype, prefix=prefix, graphs=own)
            for i, e in zip(batch, built, strict=True):
                out[i] = e.to(home)
    return [e for e in out if e is not None]


def _batches(group: list[int], lengths: list[int], budget: int) -> list[list[int]]:
    batches: list[list[int]] = []
    cur: list[int] = []
    used = 0
    for i in group:
        if cur and used + lengths[i] > budget:
            batches.append(cur)
            cur, used = [], 0
        cur.append(i)
        used += lengths[i]
    if cur:
        batches.append(cur)
    return batches
