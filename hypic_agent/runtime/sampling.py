"""Sampling: greedy and temperature / top-k / top-p, with per-token logprobs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from hypic_agent.errors import InvalidRequestError


class TokenConstraint(Protocol):
    """A per-request decoding constraint (a grammar: JSON schema, forced tool call). One instance per
    request, created by ``SamplingParams.constraint()`` when decoding starts and used only on the
    engine thread, one call of ``allowed`` then one of ``accept`` per generated token."""

    def allowed(self, vocab_size: int) -> torch.Tensor | None:
        """Bool ``[vocab_size]`` (CPU) of the tokens allowed next; None: any token."""
        ...

    def accept(self, token_id: int) -> None:
        """Advance past the sampled token."""
        ...

    def is_finished(self) -> bool:
        """The grammar is complete: decoding stops (finish reason ``stop``)."""
        ...


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 64
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: bool = False
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = field(default=())
    top_logprobs: int = 0  # with logprobs: this many most likely tokens per position (0..20)
    constraint: Callable[[], TokenConstraint] | None = field(default=None, compare=False)
    # the engine turns tokens into text (False: its events carry token ids and empty text, and whoever
    # holds the request detokenizes: the engine process's client, in the API process; no stop strings)
    detokenize: bool = True

    def validate(self) -> SamplingParams:
        if self.max_tokens < 1:
            raise InvalidRequestError("max_tokens must be >= 1", param="max_tokens")
        if not 0.0 <= self.temperature <= 5.0:
            raise InvalidRequestError("temperature must be in [0, 5]", param="temperature")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError("top_p must be in (0, 1]", param="top_p")
        if self.top_k < 0:
            raise InvalidRequestError("top_k must be >= 0", param="top_k")
        if not 0 <= self.top_logprobs <= 20:
            raise InvalidRequestError("top_logprobs must be in [0, 20]", param="top_logprobs")
        if any(not s for s in self.stop):
            raise InvalidRequestError("stop strings must be non-empty", param="stop")
        if self.stop and not self.detokenize:
            raise ValueError("stop strings are matched on the engine's text: detokenize must stay on")
        return self


def make_generator(params: SamplingParams, device: torch.device) -> torch.Generator | None:
    if params.temperature == 0.0 or params.seed is None:
        return None
    g = torch.Generator(device=device)
    g.manual_seed(params.seed)
    return g


def sample_id(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> torch.Tensor:
    """logits ``[vocab]`` -> the chosen token id, a 0-d int64 tensor on the logits' device (no host sync)."""
    if params.temperature == 0.0:
        return torch.argmax(logits)
    scores = logits.float() / params.temperature
    if params.top_k > 0 and params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, idx = torch.sort(scores, descending=True)
        probs = torch.softmax(sorted_scores, dim=-1)
        cum = torch.cumsum(probs, dim=-1)
        drop = cum - probs > params.top_p  # keep the smallest prefix whose mass reaches top_p
        sorted_scores = sorted_scores.masked_fill(drop, float("-inf"))
        scores = torch.full_like(scores, float("-inf")).scatter(0, idx, sorted_scores)
    probs = torch.softmax(scores, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[0]


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> tuple[int, float]:
    """logits ``[vocab]`` (fp32) -> (token id, logprob of that token under the unmodified distribution)."""
    tok = int(sample_id(logits, params, generator))
    return tok, float(torch.log_softmax(logits.float(), dim=-1)[tok])


def top_logprobs_of(logits: torch.Tensor, n: int) -> list[tuple[int, float]]:
    """The ``n`` most likely tokens of logits ``[vocab]`` under the unmodified distribution, as
    ``(token id, logprob)`` pairs, most likely first."""
    if n <= 0:
        return []
    lp = torch.log_softmax(logits.float(), dim=-1)
    vals, idx = torch.topk(lp, min(n, lp.shape[-1]))
    return list(zip(idx.tolist(), vals.tolist(), strict=True))


def apply_constraint(logits: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """logits ``[vocab]`` with the tokens outside ``allowed`` (bool ``[vocab']``, vocab' <= vocab:
    a tokenizer's vocabulary may be smaller than the model's logits) set to -inf."""
    if allowed is None:
        return logits
    mask = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
    mask[: allowed.shape[-1]] = allowed.to(logits.device)
    return logits.masked_fill(~mask, float("-inf"))
