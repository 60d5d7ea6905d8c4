"""Decode loop: sample, stream text through stop-string handling, stop on EOS / stop / max_tokens."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from hypic_agent.runtime.forward import decode_step
from hypic_agent.runtime.results import FinishEvent, Prepared, TokenEvent
from hypic_agent.runtime.sampling import SamplingParams, make_generator, sample
from hypic_agent.runtime.stopping import StopChecker


def decode_loop(
    engine: Any, prepared: Prepared, sampling: SamplingParams, t0: float
) -> Iterator[TokenEvent | FinishEvent]:
    state = prepared.state
    gen = make_generator(sampling, engine.device)
    stops = StopChecker(engine.tokenizer, tuple(sampling.stop))
    eos = set() if sampling.ignore_eos else set(engine.eos_ids) | set(sampling.stop_token_ids)
    ids: list[int] = []
    lps: list[float] = []
    text_parts: list[str] = []
    ttft_ms = 0.0
    finish = "length"
    for step in range(sampling.max_tokens):
        assert state.last_logits is not None
        tok, lp = sample(state.last_logits, sampling, gen)
        if step == 0:
            ttft_ms = (time.perf_counter() - t0) * 1e3
        if tok in eos:
            finish = "stop"
            break
        ids.append(tok)
        lps.append(lp)
        piece = stops.push(tok)
        if piece:
            text_parts.append(piece)
        yield TokenEvent(piece, tok, lp if sampling.logprobs else None)
        if stops.stopped:
            finish = "stop"
            break
        if step + 1 < sampling.max_tokens:
            decode_step(engine.model, [state], [tok])
    tail = stops.flush()
    if tail:
        text_parts.append(tail)
        yield TokenEvent(tail, None, None)
    yield FinishEvent(
        "".join(text_parts),
        finish,
        len(ids),
        prepared,
        ttft_ms,
        (time.perf_counter() - t0) * 1e3,
        ids,
        lps if sampling.logprobs else [],
    )
