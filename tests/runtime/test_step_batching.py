"""Composed requests' work joins the step's one forward: a burst of warm requests is prepared in one
forward (with the decode rows of others), cold segments shared by several requests are built once in
that forward, and a request whose cold segments exceed the budget is built in shares across steps
while another request decodes, each step within the budget. Answers equal each request alone."""

from __future__ import annotations

import pytest

from hypic_agent.config import Settings
from hypic_agent.runtime.engine import Engine
from hypic_agent.runtime.models.loading.tokenizer import tiny_tokenizer
from hypic_agent.runtime.results import FinishEvent
from hypic_agent.runtime.sampling import SamplingParams
from hypic_agent.runtime.scheduler.request import GenerationRequest
from hypic_agent.runtime.serving import Serving

from .conftest import make_model, rand_tokens
from .test_engine import Plan, Seg

BASE = dict(min_cached_tokens=4, kv_page_size=8, max_running=16, kv_pool_tokens=8192, max_context=1024)


def _serving(**kw) -> Serving:
    model, _, _ = make_model("qwen3_5_text")
    return Serving.of(Engine(model, tiny_tokenizer(), "tiny-test", Settings(**(BASE | kw))))


def _docs(n: int, seed: int, length: int = 24) -> list[Seg]:
    return [Seg(tuple(rand_tokens(length, seed + i))) for i in range(n)]


def _final(handle) -> FinishEvent:
    evs = list(handle.events(timeout=120))
    assert isinstance(evs[-1], FinishEvent)
    return evs[-1]


def _submit_together(serving: Serving, plans, sampling, mode="hypic"):
    """Every request queued before the engine thread's next step (it waits for the engine's lock)."""
    with serving.engine.lock:
        return [serving.scheduler.submit(GenerationRequest(p, sampling, mode)) for p in plans]


def test_a_burst_of_warm_requests_is_prepared_in_one_forward():
    serving = _serving()
    docs = _docs(6, 100)
    plans = [Plan([docs[(i + j) % 6] for j in range(4)], rand_tokens(5, 300 + i)) for i in range(8)]
    one = SamplingParams(max_tokens=1, ignore_eos=True, logprobs=True)
    for p in plans:  # every document cached
        _final(serving.scheduler.submit(GenerationRequest(p, one, "hypic")))
    alone = [_final(serving.scheduler.submit(GenerationRequest(p, one, "hypic"))) for p in plans]
    stats = serving.scheduler.stats
    before = stats.forwards, stats.combine_steps
    got = [_final(h) for h in _submit_together(serving, plans, one)]
    assert (stats.forwards - before[0], stats.combine_steps - before[1]) == (1, 8)  # one forward, 8 combines
    for a, b in zip(alone, got, strict=True):
        assert a.token_ids == b.token_ids and a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        assert b.prepared.cached_tokens == a.prepared.cached_tokens > 0  # all warm
    serving.close()


def test_a_cold_segment_shared_by_requests_of_one_step_is_built_once():
    serving = _serving()
    shared = _docs(1, 500, length=40)[0]
    plans = [Plan([shared, *_docs(2, 600 + 10 * i)], rand_tokens(4, 700 + i)) for i in range(3)]
    one = SamplingParams(max_tokens=2, ignore_eos=True, logprobs=True)
    got = [_final(h) for h in _submit_together(serving, plans, one)]
    stats = serving.scheduler.stats
    # one forward built the 7 distinct cold documents (40 + 6 x 24 tokens) and ran the 3 combines
    assert stats.cold_built_tokens == 40 + 6 * 24
    assert all(f.prepared.segments[0].hit is False for f in got)  # cold for each of them when it arrived
    ref = _serving()
    for p, f in zip(plans, got, strict=True):  # each alone on a fresh engine
        a = _final(ref.scheduler.submit(GenerationRequest(p, one, "hypic")))
        assert a.token_ids == f.token_ids and a.logprobs == pytest.approx(f.logprobs, abs=1e-4)
    serving.close()
    ref.close()


def test_cold_work_over_the_budget_is_built_in_shares_while_another_request_decodes():
    serving = _serving(prefill_chunk_tokens=64)
    sched = serving.scheduler
    long_run = sched.submit(
        GenerationRequest(
            Plan(_docs(1, 800), rand_tokens(4, 801)), SamplingParams(max_tokens=900, ignore_eos=True), "hypic"
        )
    )
    stream = long_run.events(timeout=60)  # kept open: closing it would cancel the request
    first = next(stream)  # decoding now
    assert first.token_id is not None
    big = Plan(_docs(6, 900, length=30), rand_tokens(4, 901))  # 180 cold tokens, budget 64 per step
    steps: list[int] = []
    orig = sched._run_step

    def spy():
        before = sched.stats.cold_built_tokens
        orig()
        steps.append(sched.stats.cold_built_tokens - before)

    sched._run_step = spy  # type: ignore[method-assign]
    f = _final(sched.submit(GenerationRequest(big, SamplingParams(max_tokens=2, ignore_eos=True), "hypic")))
    assert sum(steps) == 180 and max(steps) <= 64 and len([s for s in steps if s]) >= 3  # shares, within budget
    assert f.prepared.cached_tokens == 0  # none of it was cached when it arrived
    assert not long_run.cancelled  # it decoded all along
    stream.close()
    serving.close()


def test_a_forward_that_fails_fails_each_of_its_requests_with_the_error_and_the_engine_serves_on():
    serving = _serving()
    docs = _docs(4, 700)
    plans = [Plan([docs[(i + j) % 4] for j in range(3)], rand_tokens(5, 800 + i)) for i in range(3)]
    one = SamplingParams(max_tokens=1, ignore_eos=True)
    runner = serving.runner
    forward = runner.forward

    def broken(plan):
        raise RuntimeError("CUDA out of memory (simulated)")

    runner.forward = broken  # type: ignore[method-assign]
    handles = _submit_together(serving, plans, one)
    for h in handles:
        with pytest.raises(RuntimeError, match="simulated"):
            list(h.events(timeout=60))
    assert serving.scheduler.stats.failed == 3 and not serving.scheduler.live
    assert serving.pool.usage().slots_used == 0  # every slot freed
    runner.forward = forward  # type: ignore[method-assign]
    assert _final(serving.scheduler.submit(GenerationRequest(plans[0], one, "hypic"))).completion_tokens == 1
    serving.close()


def test_a_lone_prompt_is_one_forward_and_keeps_to_the_chunk_beside_decodes():
    """Nothing decoding: a prompt's chunks join into one forward (``prefill_idle_chunk_tokens``), with the
    answer of the chunked run, in both modes that prefill; beside a decoding request it stays chunked."""
    one = SamplingParams(max_tokens=1, ignore_eos=True, logprobs=True)
    chunked = _serving(prefill_chunk_tokens=64, prefill_idle_chunk_tokens=0)
    merged = _serving(prefill_chunk_tokens=64, prefill_idle_chunk_tokens=1024)
    rows: list[list[int]] = []
    forward = merged.runner.forward

    def spy(plan):
        rows.append([len(t) for t in plan.new_tokens])
        return forward(plan)

    merged.runner.forward = spy  # type: ignore[method-assign]
    for i, mode in enumerate(("full_recompute", "prefix_cache")):
        plan = Plan(_docs(6, 500 + 10 * i, length=40), rand_tokens(10, 9 + i))  # 250 tokens
        a = _final(chunked.scheduler.submit(GenerationRequest(plan, one, mode)))
        rows.clear()
        b = _final(merged.scheduler.submit(GenerationRequest(plan, one, mode)))
        assert rows == [[250]], mode  # one forward, one row of the whole prompt
        assert a.token_ids == b.token_ids and a.logprobs == pytest.approx(b.logprobs, abs=1e-4), mode
    long = merged.scheduler.submit(GenerationRequest(Plan(_docs(2, 700), rand_tokens(4, 7)), SamplingParams(
        max_tokens=900, ignore_eos=True), "full_recompute"))  # fmt: skip
    events = long.events(timeout=120)  # kept open: closing it would cancel the request
    next(events)  # decoding now
    rows.clear()
    beside = Plan(_docs(6, 800, length=40), rand_tokens(10, 3))
    _final(merged.scheduler.submit(GenerationRequest(beside, one, "full_recompute")))
    prefill = [n for r in rows for n in r if n > 1]
    assert sum(prefill) == 250 and max(prefill) <= 64, rows  # chunks of the configured size
    assert all(len(r) > 1 for r in rows if max(r) > 1)  # each beside the decoding request's row
    events.close()  # cancels it
    chunked.close()
    merged.close()
