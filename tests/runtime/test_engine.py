"""Engine pipeline on a tiny model: every mode builds a state, prefix_cache is exact, reuse is counted."""

from __future__ import annotations

import pytest
import torch

from hypic_agent.config import MODES, Settings
from hypic_agent.errors import ContextLengthError, InvalidRequestError, UnknownModeError
from hypic_agent.runtime.engine import Engine
from hypic_agent.runtime.models.loading.tokenizer import tiny_tokenizer
from hypic_agent.runtime.results import FinishEvent, TokenEvent
from hypic_agent.runtime.sampling import SamplingParams
from hypic_agent.runtime.serving import Serving

from .conftest import Plan, Seg, make_model, rand_tokens


@pytest.fixture(scope="module")
def engine() -> Engine:
    model, _, _ = make_model("qwen3_5_text")
    return Engine(model, tiny_tokenizer(), "tiny-test", Settings(min_cached_tokens=4))


def docs(n: int = 4, length: int = 24, seed: int = 300) -> list[Seg]:
    return [Seg(tuple(rand_tokens(length, seed + i))) for i in range(n)]


def test_every_mode_builds_a_state(engine):
    plan = Plan(docs())
    full = engine.prepare(plan, mode="full_recompute")
    for mode in MODES:
        if mode == "prefix_cache":  # the scheduler's radix cache (below)
            with pytest.raises(InvalidRequestError, match="radix cache"):
                engine.prepare(plan, mode=mode)
            continue
        prep = engine.prepare(plan, mode=mode)
        assert prep.state.length == full.state.length == prep.prompt_tokens
        assert prep.cached_tokens + prep.recomputed_tokens == prep.prompt_tokens


def test_prefix_cache_is_exact_and_reuses_only_the_prefix():
    model, _, _ = make_model("qwen3_5_text")
    serving = Serving.of(Engine(model, tiny_tokenizer(), "tiny-test", Settings(min_cached_tokens=4)))
    one = SamplingParams(max_tokens=1, ignore_eos=True, logprobs=True, top_logprobs=5)

    def run(plan, mode="prefix_cache"):
        evs = list(serving.generate(plan, one, mode=mode))
        assert isinstance(evs[-1], FinishEvent)
        return evs[-1]

    d = docs(5, seed=500)
    first = run(Plan(d[:4], suffix_ids=[7, 8]))
    assert first.prepared.exact_prefix_tokens == 0
    same = run(Plan(d[:4], suffix_ids=[9]))
    assert same.prepared.exact_prefix_tokens == 96
    longer = Plan([*d[:4], d[4]], suffix_ids=[9])
    ext = run(longer)
    assert ext.prepared.exact_prefix_tokens == 96  # resumes from the stored boundary
    full = run(longer, "full_recompute")
    assert ext.token_ids == full.token_ids and ext.logprobs == pytest.approx(full.logprobs, abs=1e-4)
    assert ext.top_logprobs[0][0][0] == full.top_logprobs[0][0][0]
    reordered = run(Plan([d[1], d[0], d[2], d[3]], suffix_ids=[9]))
    assert reordered.prepared.exact_prefix_tokens == 0  # a new order misses
    serving.close()


def test_hypic_reuses_segments_in_any_order(engine):
    d = docs(4, seed=700)
    first = engine.prepare(Plan(d), mode="hypic")
    # the cold segments were built in the forward: their set-up's host time is reported by part
    assert {"scatter_ms", "cold_entries_ms", "cold_sinks_ms"} <= set(first.timings_ms)
    again = engine.prepare(Plan(list(reversed(d))), mode="hypic")
    assert "cold_entries_ms" not in again.timings_ms
    assert all(s.hit for s in again.segments)
    assert again.cached_tokens == 4 * (24 - 8)
    assert again.exact_prefix_tokens == 0  # composed, never reported as an exact prefix hit


def test_generate_streams_and_finishes(engine):
    serving = Serving.of(engine)
    events = list(serving.generate(Plan(docs(2)), SamplingParams(max_tokens=5), mode="hypic"))
    serving.close()
    assert isinstance(events[-1], FinishEvent)
    assert all(isinstance(e, TokenEvent) for e in events[:-1])
    assert events[-1].completion_tokens <= 5


def test_bad_requests(engine):
    with pytest.raises(UnknownModeError):
        engine.prepare(Plan(docs(1)), mode="nope")
    with pytest.raises(ContextLengthError):
        engine.prepare(Plan([Seg(tuple(rand_tokens(5000, 1)))]), mode="hypic")
    # no query: the last segment becomes the (uncached) suffix
    prep = engine.prepare(Plan(docs(2), suffix_ids=[]), mode="hypic")
    assert prep.state.length == 48


def test_cold_segments_built_in_the_combine_match_the_scatter_path():
    """With ``fuse_cold_builds`` (default) a request's cold segments are built inside its combine
    forward: same logits as the separate scatter pass, the same entries stored (a repeat of the
    request hits every segment), and a repeated document in one request is built once."""
    model, _, _ = make_model("qwen3_5_moe_text")
    d = docs(3, seed=500)
    plan = Plan([d[0], d[1], d[0], d[2]])
    out = {}
    for fuse in (True, False):
        eng = Engine(model, tiny_tokenizer(), "tiny-test", Settings(min_cached_tokens=4, fuse_cold_builds=fuse))
        eng.prepare(Plan([d[1]]), mode="hypic")  # one warm entry, the rest cold
        first = eng.prepare(plan, mode="hypic")
        again = eng.prepare(plan, mode="hypic")
        assert [u.hit for u in first.segments] == [False, True, False, False]
        assert all(u.hit for u in again.segments)
        assert torch.allclose(first.state.last_logits, again.state.last_logits, atol=1e-4)
        out[fuse] = first.state.last_logits
    assert torch.allclose(out[True], out[False], atol=1e-4)
