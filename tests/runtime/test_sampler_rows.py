"""Batched sampling (``scheduler.sampler``): a batch mixing greedy rows, seeded sampled rows, constrained
rows (greedy and sampled, one whose mask is None) and rows with and without logprobs gives each row
exactly the token, logprob and top logprobs of that row sampled alone."""

from __future__ import annotations

from typing import Any

import torch

from hypic_agent.runtime.output import OutputStream
from hypic_agent.runtime.sampling import SamplingParams, apply_constraint, make_generator, sample_id
from hypic_agent.runtime.scheduler.sampler import sample_rows

VOCAB = 50


class Allow:
    """A constraint allowing a fixed set of tokens (or anything: ``None``)."""

    def __init__(self, ids: list[int] | None) -> None:
        self.ids = ids

    def allowed(self, vocab_size: int) -> torch.Tensor | None:
        if self.ids is None:
            return None
        mask = torch.zeros(vocab_size, dtype=torch.bool)
        mask[self.ids] = True
        return mask

    def accept(self, token_id: int) -> None: ...

    def is_finished(self) -> bool:
        return False


def _rows() -> list[SamplingParams]:
    def only(ids: list[int] | None) -> Any:
        return lambda: Allow(ids)

    return [
        SamplingParams(max_tokens=4),
        SamplingParams(max_tokens=4, logprobs=True, top_logprobs=3),
        SamplingParams(max_tokens=4, temperature=0.9, top_p=0.8, seed=3, logprobs=True),
        SamplingParams(max_tokens=4, constraint=only([5, 17, 33])),
        SamplingParams(
            max_tokens=4, temperature=1.3, top_k=10, seed=8, constraint=only([1, 2, 3, 4, 40]), logprobs=True
        ),
        SamplingParams(max_tokens=4, constraint=only(None), logprobs=True, top_logprobs=2),
        SamplingParams(max_tokens=4, temperature=0.7, seed=1),
    ]


def test_each_row_of_a_mixed_batch_is_sampled_as_alone():
    logits = torch.randn(7, VOCAB, generator=torch.Generator().manual_seed(0))
    params = _rows()
    outs = [OutputStream(None, p, ()) for p in params]
    gens = [make_generator(p, torch.device("cpu")) for p in params]
    picked = sample_rows(logits.clone(), outs, gens)
    for i, p in enumerate(params):
        mask = outs[i].allowed(VOCAB)
        gen = make_generator(p, torch.device("cpu"))
        tok = int(sample_id(apply_constraint(logits[i], mask), p, gen))
        lp = torch.log_softmax(logits[i], dim=-1)
        assert picked[i][0] == tok, i
        if mask is not None:
            assert bool(mask[tok])
        if p.logprobs:
            assert abs(picked[i][1] - float(lp[tok])) < 1e-6
        if p.logprobs and p.top_logprobs:
            vals, idx = torch.topk(lp, p.top_logprobs)
            assert [t for t, _ in picked[i][2]] == idx.tolist()  # type: ignore[union-attr]
            assert [v for _, v in picked[i][2]] == vals.tolist()  # type: ignore[union-attr]
        else:
            assert picked[i][2] is None
    assert picked[3][0] in (5, 17, 33) and picked[4][0] in (1, 2, 3, 4, 40)
