"""The scheduler on a tiny model: requests decoded together give each one's tokens and logprobs as
when decoded alone (every mode, prefill chunks in the same steps); cancel and a full pool free and
queue correctly; requests that can never fit or a full queue are refused before admission."""

from __future__ import annotations

import threading
import time

import pytest

from hypic_agent.config import MODES, Settings
from hypic_agent.errors import ContextLengthError, QueueFullError
from hypic_agent.runtime.engine import Engine
from hypic_agent.runtime.models.loading.tokenizer import tiny_tokenizer
from hypic_agent.runtime.results import FinishEvent, TokenEvent
from hypic_agent.runtime.sampling import SamplingParams
from hypic_agent.runtime.scheduler.request import GenerationRequest
from hypic_agent.runtime.serving import Serving

from .conftest import make_model, rand_tokens
from .test_engine import Plan, Seg


def _engine(**kw) -> Serving:
    """A tiny engine put to serve (``Serving``: its pool, runner and scheduler)."""
    model, _, _ = make_model("qwen3_5_text")
    base = dict(min_cached_tokens=4, kv_page_size=8, prefill_chunk_tokens=32, max_running=8, kv_pool_tokens=2048)
    return Serving.of(Engine(model, tiny_tokenizer(), "tiny-test", Settings(**(base | kw))))


def _docs(n: int, seed: int, length: int = 24) -> list[Seg]:
    return [Seg(tuple(rand_tokens(length, seed + i))) for i in range(n)]


def _final(events) -> FinishEvent:
    evs = list(events)
    assert isinstance(evs[-1], FinishEvent)
    assert all(isinstance(e, TokenEvent) for e in evs[:-1])
    return evs[-1]


SAMPLING = SamplingParams(max_tokens=6, ignore_eos=True, logprobs=True)


@pytest.mark.parametrize("mode", MODES)
def test_batched_equals_alone_in_every_mode(mode):
    plans = [Plan(_docs(3, 1000 + 10 * i)) for i in range(4)]
    alone_engine = _engine()
    alone = [_final(alone_engine.generate(p, SAMPLING, mode=mode)) for p in plans]
    alone_engine.close()
    eng = _engine()
    sched = eng.scheduler
    handles = [sched.submit(GenerationRequest(p, SAMPLING, mode)) for p in plans]  # all queued before the 1st step
    together = [_final(h.events(timeout=120)) for h in handles]
    for a, b in zip(alone, together, strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        assert a.prepared.prompt_tokens == b.prepared.prompt_tokens
    assert sched.stats.forwards < sum(len(a.token_ids) for a in alone)  # steps were shared
    snap = sched.snapshot()
    assert snap["slots_used"] == 0
    # prefix_cache keeps each prompt's segments in the radix cache: those pages only, until evicted
    assert snap["pages_used"] == snap["prefix_pages"] and (snap["prefix_pages"] > 0) == (mode == "prefix_cache")
    with eng.engine.lock:
        sched.radix.clear()
    assert sched.snapshot()["pages_used"] == 0 and sched.snapshot()["prefix_snapshots"] == 0
    eng.close()


def test_prefill_chunks_share_steps_with_decodes():
    eng = _engine(prefill_chunk_tokens=16)
    sched = eng.scheduler
    long_p = Plan(_docs(6, 2000, length=40))  # 245 tokens: 16 chunks
    short = Plan(_docs(1, 3000))
    h1 = sched.submit(GenerationRequest(short, SamplingParams(max_tokens=30, ignore_eos=True), "full_recompute"))
    h2 = sched.submit(GenerationRequest(long_p, SamplingParams(max_tokens=2, ignore_eos=True), "full_recompute"))
    f1, f2 = _final(h1.events(timeout=120)), _final(h2.events(timeout=120))
    solo = _engine()
    ref1 = _final(solo.generate(short, SamplingParams(max_tokens=30, ignore_eos=True), mode="full_recompute"))
    ref2 = _final(solo.generate(long_p, SamplingParams(max_tokens=2, ignore_eos=True), mode="full_recompute"))
    assert f1.token_ids == ref1.token_ids and f2.token_ids == ref2.token_ids
    # the long prompt's 16 chunks ran while the short one decoded: fewer forwards than chunks + decodes
    assert sched.stats.forwards < 16 + 30
    eng.close()
    solo.close()


def test_cancel_mid_stream_returns_the_pool_to_empty():
    eng = _engine()
    h = eng.scheduler.submit(GenerationRequest(Plan(_docs(2, 4000)), SamplingParams(max_tokens=200, ignore_eos=True)))
    it = h.events(timeout=60)
    got = [next(it) for _ in range(3)]
    assert all(isinstance(e, TokenEvent) for e in got)
    it.close()  # the consumer leaves: cancels
    deadline = time.time() + 30
    while eng.scheduler.snapshot()["slots_used"] and time.time() < deadline:
        time.sleep(0.01)
    snap = eng.scheduler.snapshot()
    assert snap["slots_used"] == 0 and snap["pages_used"] == 0 and eng.scheduler.stats.cancelled == 1
    eng.close()


def test_full_pool_queues_and_every_request_finishes():
    # 2 slots, pages for about 2 requests: 6 requests must wait their turn, none fails
    eng = _engine(max_running=2, kv_pool_tokens=256)
    plans = [Plan(_docs(2, 5000 + 10 * i)) for i in range(6)]
    handles = [eng.scheduler.submit(GenerationRequest(p, SamplingParams(max_tokens=5, ignore_eos=True))) for p in plans]
    results = [_final(h.events(timeout=120)) for h in handles]
    solo = _engine()
    for p, r in zip(plans, results, strict=True):
        assert r.token_ids == _final(solo.generate(p, SamplingParams(max_tokens=5, ignore_eos=True))).token_ids
    # never more than max_running (2) admitted at once: each admission finds at most one other running
    spans = [(h.admitted_at, h.request.t0 + r.total_ms / 1e3) for h, r in zip(handles, results, strict=True)]
    for start, _ in spans:
        assert start is not None and sum(a <= start < end for a, end in spans) <= 2, spans
    assert min(end for _, end in spans[:2]) <= max(a for a, _ in spans[2:])  # the last waited for a slot
    assert eng.scheduler.snapshot()["pages_used"] == 0
    eng.close()
    solo.close()


def test_refusals_before_admission():
    eng = _engine(kv_pool_tokens=64, max_waiting=1)
    with pytest.raises(ContextLengthError, match="can never fit the state pool"):
        eng.scheduler.submit(GenerationRequest(Plan(_docs(3, 6000)), SamplingParams(max_tokens=8)))
    eng.close()
    eng = _engine(max_waiting=1, max_running=1)
    sched = eng.scheduler
    gate = threading.Event()
    with eng.engine.lock:  # hold the engine: nothing is admitted, the queue fills
        sched.submit(GenerationRequest(Plan(_docs(1, 6100)), SamplingParams(max_tokens=2)))
        with pytest.raises(QueueFullError) as err:
            sched.submit(GenerationRequest(Plan(_docs(1, 6200)), SamplingParams(max_tokens=2)))
        assert err.value.status == 429 and err.value.retry_after > 0
        gate.set()
    eng.close()
