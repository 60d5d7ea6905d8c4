"""One request's output side: sampled token -> stop checks -> streamed events.

Shared by every decode loop (the scheduler's batched steps, the single-request loop): EOS and stop
token ids, stop strings (``StopChecker``), the decoding constraint (``SamplingParams.constraint``),
per-token logprobs and top logprobs, ``max_tokens``. The caller samples; this object decides what
the token means for the request and which events it produces. With ``SamplingParams.detokenize``
off (a request without stop strings from the engine process's client) the events carry the ids
and empty text: the API process detokenizes them (``core_process.detok``).
"""

from __future__ import annotations

from typing import Any

import torch

from hypic_agent.runtime.results import FinishEvent, Prepared, TokenEvent
from hypic_agent.runtime.sampling import SamplingParams, TokenConstraint
from hypic_agent.runtime.stopping import StopChecker


class OutputStream:
    def __init__(self, tokenizer: Any, sampling: SamplingParams, eos_ids: tuple[int, ...]) -> None:
        self.sampling = sampling
        self.stops = StopChecker(tokenizer, tuple(sampling.stop))
        self.eos = set() if sampling.ignore_eos else set(eos_ids) | set(sampling.stop_token_ids)
        self.constraint: TokenConstraint | None = sampling.constraint() if sampling.constraint else None
        self.ids: list[int] = []
        self.lps: list[float] = []
        self.tops: list[list[tuple[int, float]]] = []
        self.text_parts: list[str] = []
        self.finish_reason: str | None = None  # set once the request is done

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def allowed(self, vocab_size: int) -> torch.Tensor | None:
        """The constraint's mask for the next token (bool ``[vocab]`` on CPU), or None."""
        return None if self.constraint is None else self.constraint.allowed(vocab_size)

    def push(self, tok: int, logprob: float, top: list[tuple[int, float]] | None = None) -> list[TokenEvent]:
        """Take one sampled token; returns the events it releases (none for EOS)."""
        assert not self.done, "push after the request finished"
        if tok in self.eos and not (self.constraint is not None and not self.constraint.is_finished()):
            self.finish_reason = "stop"
            return []
        if self.constraint is not None:
            self.constraint.accept(tok)
        self.ids.append(tok)
        self.lps.append(logprob)
        if top is not None:
            self.tops.append(top)
        piece = self.stops.push(tok) if self.sampling.detokenize else ""
        if piece:
            self.text_parts.append(piece)
        want = self.sampling.logprobs
        ev = TokenEvent(piece, tok, logprob if want else None, top if want and top is not None else None)
        if self.stops.stopped or (self.constraint is not None and self.constraint.is_finished()):
            self.finish_reason = "stop"
        elif len(self.ids) >= self.sampling.max_tokens:
            self.finish_reason = "length"
        return [ev]

    def finish(self, prepared: Prepared, ttft_ms: float, total_ms: float) -> list[TokenEvent | FinishEvent]:
        """The held-back text (if any) and the ``FinishEvent``."""
        out: list[TokenEvent | FinishEvent] = []
        tail = self.stops.flush() if self.sampling.detokenize else ""
        if tail:
            self.text_parts.append(tail)
            out.append(TokenEvent(tail, None, None))
        want = self.sampling.logprobs
        out.append(
            FinishEvent(
                "".join(self.text_parts),
                self.finish_reason or "length",
                len(self.ids),
                prepared,
                ttft_ms,
                total_ms,
                list(self.ids),
                list(self.lps) if want else [],
                list(self.tops) if want and self.sampling.top_logprobs else [],
            )
        )
        return out
