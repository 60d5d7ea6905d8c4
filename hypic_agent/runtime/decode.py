"""Single-request decode loop: sample, stream through ``OutputStream``, stop on EOS / stop / length."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from hypic_agent.runtime.output import OutputStream
from hypic_agent.runtime.results import FinishEvent, Prepared, TokenEvent
from hypic_agent.runtime.runner.standalone import decode_step
from hypic_agent.runtime.sampling import SamplingParams, apply_constraint, make_generator, sample, top_logprobs_of


def decode_loop(
    engine: Any, prepared: Prepared, sampling: SamplingParams, t0: float
) -> Iterator[TokenEvent | FinishEvent]:
    state = prepared.state
    assert state is not None, "decode_loop needs a standalone state (Engine.prepare)"
    gen = make_generator(sampling, engine.device)
    out = OutputStream(engine.tokenizer, sampling, engine.eos_ids)
    ttft_ms = 0.0
    while not out.done:
        logits = state.last_logits
        assert logits is not None
        tok, _ = sample(apply_constraint(logits, out.allowed(logits.shape[-1])), sampling, gen)
        lp = float(logits.float().log_softmax(-1)[tok])  # under the model's own distribution
        if not out.ids and ttft_ms == 0.0:
            ttft_ms = (time.perf_counter() - t0) * 1e3
        top = top_logprobs_of(logits, sampling.top_logprobs) if sampling.logprobs else None
        yield from out.push(tok, lp, top)
        if not out.done:
            decode_step(engine.model, [state], [tok])
    yield from out.finish(prepared, ttft_ms, (time.perf_counter() - t0) * 1e3)
