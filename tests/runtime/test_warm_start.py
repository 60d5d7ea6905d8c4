"""Warm start (``runtime/warm_start.py``) on a tiny model on the CPU: one decode-only forward per
decode bucket, the prefill sizes and the composed requests go through the real runner and scheduler;
afterwards the pool, the radix cache, the segment store and the counters are as they were, and
requests give exactly the tokens and logprobs of an engine that never warmed up. ``serve`` runs it
before "listening" unless ``HYPIC_WARM_START=false``, with Triton's caches under the home."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hypic_agent.config import Settings
from hypic_agent.runtime.engine import Engine
from hypic_agent.runtime.hypic.store_cache import StoreEntryCache
from hypic_agent.runtime.models.loading.tokenizer import tiny_tokenizer
from hypic_agent.runtime.results import FinishEvent
from hypic_agent.runtime.runner.plan import ForwardPlan
from hypic_agent.runtime.sampling import SamplingParams
from hypic_agent.runtime.serving import Serving
from hypic_agent.runtime.warm_start import (
    TRITON_DIR,
    composed_segments,
    decode_sizes,
    persisted_compile_cache,
    prefill_sizes,
    warm_up,
)
from hypic_agent.segments.store.segment_store import SegmentStore

from .conftest import Plan, Seg, make_model, rand_tokens

# 24 slots but decode graphs up to 20 rows: buckets 1, 2, 4, 8, 16 and 20 (capped at the setting)
BASE = dict(
    kv_page_size=8,
    prefill_chunk_tokens=64,
    max_running=24,
    decode_graph_max_batch=20,
    kv_pool_tokens=2048,
    min_cached_tokens=4,
    warm_start_prefill_tokens=[8, 61, 64, 500],  # 500: capped at the chunk, so 64 once
    warm_start_segments=[32, 24, 20],
)
BUCKETS = (1, 2, 4, 8, 16, 20)


def _serving(**kw: Any) -> Serving:
    model, _, _ = make_model("qwen3_5_text")
    return Serving.of(Engine(model, tiny_tokenizer(), "tiny-test", Settings(**(BASE | kw))))


class _Spy:
    """Wraps ``runner.forward``: per plan (kind, rows, sequence lengths before it ran)."""

    def __init__(self, serving: Serving) -> None:
        self.plans: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = []
        self._forward = serving.runner.forward
        serving.runner.forward = self  # type: ignore[method-assign]

    def __call__(self, plan: ForwardPlan) -> Any:
        if plan.colds:
            kind = "cold"
        elif plan.combines:
            kind = "combine"
        elif plan.decode_only:
            kind = "decode"
        else:
            kind = "prefill"
        rows = tuple(len(t) for t in plan.new_tokens)
        self.plans.append((kind, rows, tuple(s.length for s in plan.seqs)))
        return self._forward(plan)


def _final(events: Any) -> FinishEvent:
    evs = list(events)
    assert isinstance(evs[-1], FinishEvent)
    return evs[-1]


def _docs(n: int, seed: int, length: int = 24) -> list[Seg]:
    return [Seg(tuple(rand_tokens(length, seed + i))) for i in range(n)]


def test_every_decode_bucket_prefill_size_and_composed_request_runs_through_the_runner() -> None:
    srv = _serving()
    spy = _Spy(srv)
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    report = warm_up(srv, lambda *a, **k: calls.append((a, k)))

    assert decode_sizes(srv) == BUCKETS and report.decode_buckets == BUCKETS
    # first: one decode-only forward of exactly b fresh one-token sequences per bucket, in order
    decodes = spy.plans[: len(BUCKETS)]
    assert [kind for kind, _, _ in decodes] == ["decode"] * len(BUCKETS)
    assert [len(rows) for _, rows, _ in decodes] == list(BUCKETS)
    assert all(set(lengths) == {0} for _, _, lengths in decodes)
    # then each prefill size alone in one chunk (500 capped at prefill_chunk_tokens = 64)
    assert report.prefill_tokens == (8, 61, 64)
    prefills = [rows for kind, rows, lengths in spy.plans if kind == "prefill" and set(lengths) == {0}]
    assert prefills[:3] == [(8,), (61,), (64,)]
    # the prefix_cache pair: the second request resumes the first's 56 cached tokens (32 + 24)
    assert report.prefix_cache
    assert ("prefill", (16,), (56,)) in spy.plans
    # composed: cold builds fused into the first request's forward, then a combine over hits alone
    assert report.composed_modes == ("hypic",) and report.segments == (32, 24, 20)
    kinds = [kind for kind, _, _ in spy.plans]
    assert kinds.count("cold") == 1 and kinds.count("combine") == 1 and kinds.index("cold") < kinds.index("combine")

    # progress: one counted report per decode bucket, prompt and composed request, then the seconds
    counted = [(a[0], k["done"], k["total"], k["unit"]) for a, k in calls if "done" in k]
    assert [c for c in counted if c[0] == "warming up: decode buckets"] == [
        ("warming up: decode buckets", i + 1, len(BUCKETS), "buckets") for i in range(len(BUCKETS))
    ]
    assert [c[1:] for c in counted if c[0] == "warming up: prefill"] == [(i, 5, "prompts") for i in range(1, 6)]
    composed = [c[1:] for c in counted if c[0] == "warming up: composed requests"]
    assert composed == [(1, 2, "requests"), (2, 2, "requests")]
    assert calls[-1][0][0].startswith("warm start took ") and calls[-1][1] == {}
    assert calls[-1][0][0].endswith("s (6 decode buckets, 5 prefills, 2 composed requests)")
    assert report.skipped == []
    srv.close()


def test_it_leaves_the_pool_store_radix_cache_and_counters_as_found(tmp_path: Path) -> None:
    srv = _serving()
    engine, sched = srv.engine, srv.scheduler
    store = SegmentStore.from_settings(Settings(home=tmp_path, device="cpu"))
    cache = StoreEntryCache(store, engine.model.config.layer_types, engine.fingerprint)
    engine.cache = cache
    before = dict(vars(sched.stats))

    warm_up(srv, None)

    assert engine.cache is cache and store.stats().entries == 0 and not cache.inserts
    assert cache.hits == 0 and cache.misses == 0
    snap = sched.snapshot()
    assert (snap["slots_used"], snap["pages_used"], snap["prefix_nodes"], snap["prefix_snapshots"]) == (0, 0, 0, 0)
    assert srv.pool.free_slots == srv.pool.n_slots and srv.pool.free_pages == srv.pool.n_pages
    assert srv.pool.usage().snapshots_used == 0
    radix = sched.radix.stats()
    assert (radix.hits, radix.inserts, radix.evicted_nodes) == (0, 0, 0)
    assert dict(vars(sched.stats)) == before and sched.stats.finished == 0
    assert sched._thread is not None and not sched._thread.is_alive()  # its engine thread stopped again

    # the store is the engine's again: a real request stores its segments there, under its tenant
    fin = _final(srv.generate(Plan(_docs(2, 900)), SamplingParams(max_tokens=2, ignore_eos=True), mode="hypic"))
    assert fin.completion_tokens == 2 and store.stats().entries == 2
    assert sched.stats.finished == 1
    srv.close()
    store.close()


def test_a_radix_cache_in_use_is_left_alone() -> None:
    srv = _serving()
    sp = SamplingParams(max_tokens=2, ignore_eos=True)
    _final(srv.generate(Plan(_docs(2, 700)), sp, mode="prefix_cache"))
    nodes = srv.scheduler.radix.stats().nodes
    assert nodes > 0
    report = warm_up(srv, None)
    assert not report.prefix_cache and srv.scheduler.radix.stats().nodes == nodes
    srv.close()


@pytest.mark.parametrize("mode", ["hypic", "full_recompute", "prefix_cache"])
def test_requests_after_warm_start_match_an_engine_without_it(mode: str) -> None:
    plans = [Plan(_docs(3, 1000 + 10 * i)) for i in range(2)] + [Plan(_docs(3, 1000))]  # the last reuses the first
    sampling = SamplingParams(max_tokens=6, ignore_eos=True, logprobs=True)
    warm, cold = _serving(), _serving()
    report = warm_up(warm, None)
    assert report.decode_buckets == BUCKETS and report.composed_modes == ("hypic",)
    for p in plans:
        a = _final(warm.generate(p, sampling, mode=mode))
        b = _final(cold.generate(p, sampling, mode=mode))
        assert a.token_ids == b.token_ids and len(a.token_ids) == 6
        assert a.logprobs == b.logprobs
        assert a.prepared.cached_tokens == b.prepared.cached_tokens
        assert a.prepared.prompt_tokens == b.prepared.prompt_tokens
    warm.close()
    cold.close()


def test_sizes_are_capped_by_the_chunk_the_pool_and_the_context() -> None:
    # a pool of 12 slots and 96 KV rows: decode buckets up to the slots; prompts of at most 95 tokens
    srv = _serving(
        max_running=12,
        decode_graph_max_batch=128,
        kv_pool_tokens=96,
        prefill_chunk_tokens=256,
        warm_start_prefill_tokens=[200, 40, 40],
        warm_start_segments=[40, 30, 20, 5],
    )
    assert decode_sizes(srv) == (1, 2, 4, 8, 12)
    assert prefill_sizes(srv) == (40, 95)
    assert composed_segments(srv) == (40, 30)  # + 16-token question + 2 new tokens: 20 more do not fit
    report = warm_up(srv, None)
    # the largest bucket's 12 one-page sequences take every page
    assert report.decode_buckets == (1, 2, 4, 8, 12) and report.prefill_tokens == (40, 95)
    assert srv.scheduler.snapshot()["pages_used"] == 0
    srv.close()
    auto = _serving(warm_start_prefill_tokens=[])
    assert prefill_sizes(auto) == (64,)  # CPU: nothing compiles, the path runs once
    auto.close()


def test_a_bucket_the_pool_cannot_hold_is_skipped_and_said() -> None:
    srv = _serving(kv_pool_tokens=8 * 10)  # 10 pages: buckets 16 and 20 need more one-page sequences
    report = warm_up(srv, None)
    assert report.decode_buckets == (1, 2, 4, 8)
    assert [s.split(":")[0] for s in report.skipped] == ["decode batch 16", "decode batch 20"]
    assert srv.pool.free_pages == srv.pool.n_pages and srv.pool.free_slots == srv.pool.n_slots
    srv.close()


# ---------------------------------------------------------------------------- Triton's caches
def test_triton_caches_go_under_home_when_unset_and_come_back_out(tmp_path: Path) -> None:
    env: dict[str, str] = {"PATH": "/bin"}
    with persisted_compile_cache(tmp_path, env) as added:
        assert env["TRITON_CACHE_DIR"] == str(tmp_path / TRITON_DIR) and env["TRITON_CACHE_AUTOTUNING"] == "1"
        assert added == {"TRITON_CACHE_DIR": str(tmp_path / "triton"), "TRITON_CACHE_AUTOTUNING": "1"}
        assert (tmp_path / "triton").is_dir()
    assert env == {"PATH": "/bin"}


def test_triton_variables_the_user_set_are_left_alone(tmp_path: Path) -> None:
    env = {"TRITON_CACHE_DIR": "/srv/triton", "TRITON_CACHE_AUTOTUNING": "0"}
    with persisted_compile_cache(tmp_path, env) as added:
        assert env == {"TRITON_CACHE_DIR": "/srv/triton", "TRITON_CACHE_AUTOTUNING": "0"} and added == {}
    assert env == {"TRITON_CACHE_DIR": "/srv/triton", "TRITON_CACHE_AUTOTUNING": "0"}
    assert not (tmp_path / "triton").exists()
    only_dir = {"TRITON_CACHE_DIR": "/srv/triton"}
    with persisted_compile_cache(tmp_path, only_dir) as added:
        assert added == {"TRITON_CACHE_AUTOTUNING": "1"} and only_dir["TRITON_CACHE_DIR"] == "/srv/triton"
    assert only_dir == {"TRITON_CACHE_DIR": "/srv/triton"}


def test_importing_the_warm_start_imports_no_triton_kernel() -> None:
    """serve sets the variables after importing ``warm_start``: an autotuner created by that import
    would not see ``TRITON_CACHE_AUTOTUNING``."""
    code = (
        "import sys, hypic_agent.api.serve, hypic_agent.runtime.warm_start\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('triton', 'fla')))"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, check=True)
    assert out.stdout.strip() == "[]", out.stdout


# ---------------------------------------------------------------------------- serve
@pytest.mark.parametrize("warm", [True, False, "auto"])
def test_serve_warms_up_before_listening_unless_turned_off(
    warm: bool | str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import uvicorn

    from hypic_agent.api.serve import run_server
    from hypic_agent.startup import hold_port

    seen: dict[str, Any] = {}

    async def stop_at_once(self: Any) -> None:  # start-up only: the server starts, then stops
        seen["cache_dir"] = os.environ.get("TRITON_CACHE_DIR")
        seen["autotuning"] = os.environ.get("TRITON_CACHE_AUTOTUNING")

    monkeypatch.setattr(uvicorn.Server, "main_loop", stop_at_once)
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.delenv("TRITON_CACHE_AUTOTUNING", raising=False)
    if warm != "auto":
        monkeypatch.setenv("HYPIC_WARM_START", str(warm).lower())
    settings = Settings(model="tiny:qwen3_5_text", device="cpu", home=tmp_path, max_running=8, log_level="INFO")
    assert settings.warm_start == warm
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        run_server(settings, sock=hold_port("127.0.0.1", 0))
    finally:
        root.handlers[:], root.level = saved
    lines = [json.loads(x) for x in capsys.readouterr().err.splitlines() if x.startswith("{")]
    msgs = [x["msg"] for x in lines]
    before = [x["msg"] for x in lines[: msgs.index("listening")] if x["logger"] == "hypic.startup"]
    warming = [m for m in before if m.startswith(("warming up", "warm start"))]
    if warm == "auto":  # the default on the CPU: said, and skipped
        assert [m for m in before if m.startswith("no warm start")] == [
            "no warm start on cpu: nothing compiles there (HYPIC_WARM_START=true runs it)"
        ]
        assert warming == []
    elif warm:
        assert warming[0].startswith("warming up: compiling and capturing before listening")
        assert f"kept in {tmp_path / 'triton'}" in warming[0]
        assert "warming up: decode buckets: 4 buckets of 4 buckets (100%)" in warming  # 1, 2, 4, 8 rows (8 slots)
        assert warming[-1].startswith("warm start took ")
    else:
        assert warming == []
    routes = [m for m in before if m.startswith("warmed the API routes")]
    if warm is True:  # then the API routes, each through the app once (``api.warm_routes``)
        assert routes == [before[-1]] and routes[0].startswith("warmed the API routes: 3 of 3 requests")
        before = before[:-1]
    else:
        assert routes == []
    assert before[-1].startswith("model tiny:qwen3_5_text ready, 0 stored entries")
    # Triton's caches were under the home while it served, and are unset again after
    assert seen == {"cache_dir": str(tmp_path / "triton"), "autotuning": "1"}
    assert "TRITON_CACHE_DIR" not in os.environ and "TRITON_CACHE_AUTOTUNING" not in os.environ
