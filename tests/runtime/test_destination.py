"""The combine writes a composed request's state straight into its pool slot and pages
(``runner.destination``): the pool then holds what the old path (standalone state + ``StatePool.load``)
put there, in a contiguous run of pages (K/V assembled in place) and in a fragmented pool (scattered
per layer); served through the scheduler, composed requests never call ``StatePool.load``, give the
old path's tokens and logprobs, and leave the pool empty after finishing and after a cancel."""

from __future__ import annotations

import time

import pytest
import torch

from hypic_agent.config import Settings
from hypic_agent.runtime.engine import Engine
from hypic_agent.runtime.models.loading.tokenizer import tiny_tokenizer
from hypic_agent.runtime.results import FinishEvent, TokenEvent
from hypic_agent.runtime.runner.destination import StateDestination
from hypic_agent.runtime.runner.pool import StatePool
from hypic_agent.runtime.sampling import SamplingParams
from hypic_agent.runtime.scheduler.request import GenerationRequest
from hypic_agent.runtime.serving import Serving, build_pool
from hypic_agent.runtime.state import AttentionLayerState

from .conftest import Plan, Seg, make_model, rand_tokens

COMPOSED = ("addition", "transition", "transition_rope", "hypic")
SETTINGS = dict(min_cached_tokens=4, kv_page_size=4, prefill_chunk_tokens=32, max_running=4, kv_pool_tokens=1024)


def _plan(seed: int, n: int = 3, length: int = 18) -> Plan:
    return Plan([Seg(tuple(rand_tokens(length, seed + i))) for i in range(n)], rand_tokens(5, seed))


def _pool(model, page_size: int = 4, kv_tokens: int = 1024, slots: int = 4) -> StatePool:
    p = next(model.parameters())
    return StatePool(
        model.config, slots=slots, kv_tokens=kv_tokens, page_size=page_size, device=p.device, dtype=p.dtype
    )


def test_alloc_prefers_a_contiguous_run_and_frees_back():
    model, _, _ = make_model("qwen3_5_text")
    pool = _pool(model, page_size=4, kv_tokens=32, slots=8)  # 8 pages
    singles = [pool.alloc(4) for _ in range(8)]
    assert [s.pages for s in singles] == [[i] for i in range(1, 9)]  # type: ignore[union-attr]
    for s in singles[0::2]:  # pages 1, 3, 5, 7 free: no run of two
        pool.free(s)  # type: ignore[arg-type]
    frag = pool.alloc(16)
    assert frag is not None and frag.pages == [1, 3, 5, 7] and pool.first_row(frag, 16) is None
    assert pool.first_row(frag, 4) == 4  # one page is a run
    pool.free(frag)
    for s in singles[1::2]:
        pool.free(s)  # type: ignore[arg-type]
    assert pool.usage().pages_used == 0
    a, b, c = pool.alloc(8), pool.alloc(4), pool.alloc(8)  # [1, 2], [3], [4, 5]
    pool.free(a)  # type: ignore[arg-type]
    run = pool.alloc(12)  # 3 pages: not [1, 2, 6] but the run [6, 7, 8]
    assert run is not None and run.pages == [6, 7, 8] and pool.first_row(run, 12) == 6 * 4
    for s in (b, c, run):
        pool.free(s)  # type: ignore[arg-type]
    assert pool.usage().pages_used == 0 and pool.usage().slots_used == 0


def _fragment(pool: StatePool) -> None:
    """Hold every free page, then free every other one: no two free pages are consecutive."""
    held = []
    while (s := pool.alloc(pool.page_size)) is not None:
        held.append(s)
    for s in held[0::2]:
        pool.free(s)


@pytest.mark.parametrize("fragmented", [False, True])
@pytest.mark.parametrize("mode", COMPOSED)
def test_combine_into_the_pool_equals_load(mode, fragmented, monkeypatch):
    model, _, _ = make_model("qwen3_5_text")
    ref_eng = Engine(model, tiny_tokenizer(), "t", Settings(**SETTINGS))
    eng = Engine(model, tiny_tokenizer(), "t", Settings(**SETTINGS))
    ref_pool, pool = _pool(model, slots=2, kv_tokens=512), _pool(model, slots=160 if fragmented else 2, kv_tokens=512)
    placed: list[bool] = []
    in_place = StateDestination.in_place
    monkeypatch.setattr(
        StateDestination, "in_place", lambda s, li, st: placed.append(in_place(s, li, st)) or placed[-1]
    )
    plans = [_plan(100), Plan(list(reversed(_plan(100).segments)), rand_tokens(7, 9))]  # cold, then all hits
    for plan in plans:
        p = eng.pieces(plan, mode=mode)
        ref = ref_eng.prepare_pieces(p)
        assert ref.state is not None
        ref_seq = ref_pool.alloc(p.total + 4)
        ref_pool.load(ref_seq, ref.state)  # type: ignore[arg-type]
        if fragmented:
            _fragment(pool)
        seq = pool.alloc(p.total + 4)
        assert seq is not None
        into = StateDestination.of(pool, seq, p.total)
        assert (into.first is None) == fragmented
        got = eng.prepare_pieces(p, into=into)
        assert got.state is not None and got.state.layers == []  # the pool holds them
        into.commit(got.state)
        assert seq.length == p.total and seq.tokens == ref.state.tokens
        torch.testing.assert_close(got.state.last_logits, ref.state.last_logits, rtol=0, atol=1e-5)
        assert (got.cached_tokens, got.recomputed_tokens) == (ref.cached_tokens, ref.recomputed_tokens)
        mine, theirs = pool.export(seq), ref_pool.export(ref_seq)  # type: ignore[arg-type]
        n_att = 0
        for a, b in zip(mine.layers, theirs.layers, strict=True):
            n_att += isinstance(a, AttentionLayerState)
            for x, y in zip(vars(a).values(), vars(b).values(), strict=True):
                assert x.abs().sum() > 0  # written, not the zeroed pool
                torch.testing.assert_close(x, y, rtol=0, atol=1e-5)
        assert n_att > 0
    # every attention layer of both requests was assembled in the pool's rows, or none was
    assert placed == [not fragmented] * (2 * n_att)


def _serve(model) -> Serving:
    return Serving.of(Engine(model, tiny_tokenizer(), "t", Settings(**SETTINGS)))


def _final(events) -> FinishEvent:
    evs = list(events)
    assert isinstance(evs[-1], FinishEvent) and all(isinstance(e, TokenEvent) for e in evs[:-1])
    return evs[-1]


def test_scheduled_composed_requests_skip_load_and_batched_match_alone(monkeypatch):
    model, _, _ = make_model("qwen3_5_text")
    sampling = SamplingParams(max_tokens=6, ignore_eos=True, logprobs=True)
    plans = [_plan(200 + 10 * i) for i in range(3)]
    reqs = [(p, m) for m in COMPOSED for p in plans]
    old = _serve(model)  # one request at a time: each combine alone in its forward
    ref = [_final(old.generate(p, sampling, mode=mode)) for p, mode in reqs]
    old.close()

    def refuse(self, seq, state):
        raise AssertionError("a composed request went through StatePool.load")

    monkeypatch.setattr(StatePool, "load", refuse)
    serving = _serve(model)
    handles = [serving.scheduler.submit(GenerationRequest(p, sampling, mode)) for p, mode in reqs]
    got = [_final(h.events(timeout=120)) for h in handles]
    for a, b in zip(ref, got, strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    # whole-segment seams recompute everything: the composed state is full recompute's
    whole = _final(serving.generate(plans[0], sampling, mode="hypic", seam=1.0))
    full = _final(serving.generate(plans[0], sampling, mode="full_recompute"))
    assert whole.token_ids == full.token_ids and whole.logprobs == pytest.approx(full.logprobs, abs=1e-4)
    assert serving.scheduler.stats.failed == 0
    snap = serving.scheduler.snapshot()
    assert snap["slots_used"] == 0 and snap["pages_used"] == 0
    serving.close()


def test_cancelled_composed_request_returns_the_pool_to_empty():
    model, _, _ = make_model("qwen3_5_text")
    serving = _serve(model)
    h = serving.scheduler.submit(
        GenerationRequest(_plan(300), SamplingParams(max_tokens=200, ignore_eos=True), "hypic")
    )
    it = h.events(timeout=60)
    assert all(isinstance(next(it), TokenEvent) for _ in range(3))
    assert serving.scheduler.snapshot()["pages_used"] > 0
    it.close()  # cancels
    deadline = time.time() + 30
    while serving.scheduler.snapshot()["slots_used"] and time.time() < deadline:
        time.sleep(0.01)
    snap = serving.scheduler.snapshot()
    assert snap["slots_used"] == 0 and snap["pages_used"] == 0 and serving.scheduler.stats.cancelled == 1
    serving.close()


def test_serving_builds_one_pool_sized_by_the_settings():
    model, _, _ = make_model("qwen3_5_text")
    eng = Engine(model, tiny_tokenizer(), "t", Settings(**SETTINGS))
    pool = build_pool(eng)
    assert (pool.n_slots, pool.n_pages, pool.page_size) == (4, 1024 // 4, 4)
    serving = Serving.of(eng)
    assert serving.scheduler.pool is serving.pool and serving.runner.pool is serving.pool
    assert not hasattr(eng, "scheduler")  # the engine serves nothing itself
    assert Serving.of(eng) is serving  # one pool and scheduler per engine
    with pytest.raises(RuntimeError, match="served already"):
        Serving(eng)
    serving.stop()
    assert Serving.of(eng) is serving  # stopped: the next submit restarts the same scheduler
    got = _final(serving.generate(_plan(400), SamplingParams(max_tokens=2, ignore_eos=True), mode="hypic"))
    assert len(got.token_ids) == 2
    serving.close()
