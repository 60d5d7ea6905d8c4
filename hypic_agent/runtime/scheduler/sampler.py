"""Batched sampling on the device: one argmax (and logprob gather) for all greedy rows, the
sampled rows one by one, constraint masks applied first; one read-back of the ids per step."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hypic_agent.runtime.output import OutputStream
from hypic_agent.runtime.sampling import apply_constraint, sample


def sample_rows(
    logits: torch.Tensor, outs: Sequence[OutputStream], gens: Sequence[torch.Generator | None]
) -> list[tuple[int, float, list[tuple[int, float]] | None]]:
    """logits ``[N, vocab]`` fp32 -> per row ``(token id, logprob under the model, top logprobs or None)``."""
    vocab = logits.shape[-1]
    masks = [o.allowed(vocab) for o in outs]
    scores = logits
    if any(m is not None for m in masks):
        scores = torch.stack([apply_constraint(logits[i], m) for i, m in enumerate(masks)])
    toks = scores.argmax(dim=-1)
    for i, o in enumerate(outs):
        if o.sampling.temperature > 0.0:
            toks[i] = sample(scores[i], o.sampling, gens[i])[0]
    want_lp = [o.sampling.logprobs for o in outs]
    ids = toks.tolist()
    if not any(want_lp):
        return [(t, 0.0, None) for t in ids]
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # once for every row (chosen and top tokens)
    lp_list = logprobs.gather(1, toks[:, None])[:, 0].tolist()
    out: list[tuple[int, float, list[tuple[int, float]] | None]] = []
    for i, o in enumerate(outs):
        top = None
        if want_lp[i] and o.sampling.top_logprobs:
            vals, idx = torch.topk(logprobs[i], min(o.sampling.top_logprobs, vocab))
            top = list(zip(idx.tolist(), vals.tolist(), strict=True))
        out.append((ids[i], lp_list[i], top))
    return out
