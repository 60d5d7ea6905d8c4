"""Overlap scheduling (``Settings.overlap_schedule``): decode steps launched before the previous
step's tokens are read give the same tokens, logprobs, top logprobs and finish reasons as the plain
loop, in every mode, for a batch mixing greedy, seeded sampling, early stops (a stop token: its
request already has a row in the next step, whose token is dropped) and one- and two-token requests;
the pool is left as the plain loop leaves it."""

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

BASE = dict(min_cached_tokens=4, kv_page_size=8, prefill_chunk_tokens=64, max_running=8, kv_pool_tokens=4096)


def _serving(overlap: bool) -> Serving:
    model, _, _ = make_model("qwen3_5_text")
    return Serving.of(Engine(model, tiny_tokenizer(), "tiny-test", Settings(**BASE, overlap_schedule=overlap)))


def _plans() -> list[Plan]:
    docs = [Seg(tuple(rand_tokens(20, 40 + i))) for i in range(5)]
    return [Plan([docs[(i + j) % 5] for j in range(3)], rand_tokens(4, 90 + i)) for i in range(6)]


def _run(overlap: bool, mode: str, samplings: list[SamplingParams]) -> tuple[list[FinishEvent], Serving]:
    serving = _serving(overlap)
    plans = _plans()
    with serving.engine.lock:  # every request queued before the first step: the same steps both ways
        handles = [serving.scheduler.submit(GenerationRequest(p, s, mode)) for p, s in zip(plans, samplings)]
    finals = []
    for h in handles:
        evs = list(h.events(timeout=120))
        assert isinstance(evs[-1], FinishEvent)
        finals.append(evs[-1])
    return finals, serving


@pytest.mark.parametrize("mode", ["full_recompute", "prefix_cache", "hypic"])
def test_overlap_on_and_off_give_the_same_tokens_and_logprobs(mode):
    greedy = SamplingParams(max_tokens=8, ignore_eos=True, logprobs=True)
    ref, ref_serving = _run(False, mode, [greedy] * 6)
    ref_serving.close()
    stop_tok = ref[4].token_ids[2]  # request 4 stops at (or before) its third token
    samplings = [
        SamplingParams(max_tokens=7, ignore_eos=True, logprobs=True, top_logprobs=3),
        SamplingParams(max_tokens=6, ignore_eos=True, logprobs=True, temperature=0.8, top_p=0.9, seed=5),
        SamplingParams(max_tokens=1, ignore_eos=True, logprobs=True),
        SamplingParams(max_tokens=2, ignore_eos=True),
        SamplingParams(max_tokens=8, logprobs=True, stop_token_ids=(stop_tok,)),
        SamplingParams(max_tokens=5, ignore_eos=True, logprobs=True, temperature=1.2, top_k=20, seed=11),
    ]
    off, s_off = _run(False, mode, samplings)
    on, s_on = _run(True, mode, samplings)
    assert s_off.scheduler.stats.overlapped_steps == 0
    assert s_on.scheduler.stats.overlapped_steps > 0  # the decode steps did overlap
    assert [len(f.token_ids) for f in off] == [7, 6, 1, 2, ref[4].token_ids.index(stop_tok), 5]
    for a, b in zip(off, on, strict=True):
        assert a.token_ids == b.token_ids
        assert a.finish_reason == b.finish_reason
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
        assert [[t for t, _ in top] for top in a.top_logprobs] == [[t for t, _ in top] for top in b.top_logprobs]
    assert off[4].finish_reason == "stop" and off[0].finish_reason == "length"
    assert len(on[0].top_logprobs) == 7 and all(len(t) == 3 for t in on[0].top_logprobs)
    # the greedy request equals the plain greedy run's first 7 tokens (the top logprobs changed nothing)
    assert on[0].token_ids == ref[0].token_ids[:7]
    # every slot is free again; the prefix cache (prefix_cache mode) holds the same pages either way
    u_off, u_on = s_off.pool.usage(), s_on.pool.usage()
    assert u_on.slots_used == u_off.slots_used == 0
    assert u_on.pages_used == u_off.pages_used
    s_off.close()
    s_on.close()


def test_a_cancelled_request_in_flight_is_dropped_and_the_others_finish():
    serving = _serving(True)
    plans = _plans()[:3]
    short, long = SamplingParams(max_tokens=40, ignore_eos=True), SamplingParams(max_tokens=300, ignore_eos=True)
    with serving.engine.lock:  # request 0 cannot finish before its consumer cancels it
        handles = [
            serving.scheduler.submit(GenerationRequest(p, long if i == 0 else short, "hypic"))
            for i, p in enumerate(plans)
        ]
    it = handles[0].events(timeout=120)
    next(it)
    next(it)  # two tokens streamed: it is decoding, its next token maybe in flight
    handles[0].cancel()
    finals = [list(h.events(timeout=120))[-1] for h in handles[1:]]
    assert [len(f.token_ids) for f in finals] == [40, 40]
    assert serving.scheduler.stats.cancelled == 1
    assert serving.pool.usage().slots_used == 0
    serving.close()
