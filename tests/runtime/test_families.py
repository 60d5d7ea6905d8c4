"""LFM2, Granite 4, Nemotron-H, MiniMax, Kimi Linear, Ring-linear, Ling 3 and Falcon-H1 served as a user runs
them: ``tiny:<arch>`` through the loader, the engine (scheduler + runner over the state pool) and the HTTP API,
in every mode."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from hypic_agent.config import MODES, Settings
from hypic_agent.runtime.engine import Engine
from hypic_agent.runtime.results import TokenEvent
from hypic_agent.runtime.sampling import SamplingParams
from hypic_agent.runtime.serving import Serving

from .conftest import Plan, Seg, rand_tokens

ARCHS = [
    "lfm2", "granitemoehybrid", "nemotron_h", "minimax", "kimi_linear", "bailing_moe_linear", "bailing_hybrid",
    "falcon_h1",
]  # fmt: skip


@pytest.fixture(scope="module", params=ARCHS)
def engine(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Engine:
    from hypic_agent.runtime.loader import load_engine

    home = tmp_path_factory.mktemp(f"home-{request.param}")
    eng = load_engine(Settings(home=home, device="cpu", min_cached_tokens=4), model=f"tiny:{request.param}")
    yield eng
    eng.close()


def docs(n: int = 3, length: int = 24, seed: int = 300) -> list[Seg]:
    return [Seg(tuple(rand_tokens(length, seed + i))) for i in range(n)]


def greedy(engine: Engine, plan: Plan, mode: str, seam: float | None = None) -> list[int]:
    serving = Serving.of(engine)
    events = list(serving.generate(plan, SamplingParams(max_tokens=6, temperature=0.0), mode=mode, seam=seam))
    serving.stop()  # the engine is the fixture's
    return [e.token_id for e in events if isinstance(e, TokenEvent) and e.token_id is not None]


def test_tiny_family_loads_with_its_mixers(engine):
    kinds = {layer.mixer_kind for layer in engine.model.layers}
    linear = {
        "lfm2": "short_conv",
        "minimax": "lightning",
        "kimi_linear": "kda",
        "bailing_moe_linear": "lightning_rope",
        "bailing_hybrid": "kda",
    }.get(engine.model.config.family, "mamba2")
    assert kinds == {"attention", linear}
    assert engine.name.startswith("tiny:")


def test_every_mode_builds_a_state_and_prefix_cache_is_exact(engine):
    plan = Plan(docs())
    full = engine.prepare(plan, mode="full_recompute")
    for mode in MODES:
        if mode == "prefix_cache":  # served through the scheduler's radix cache (below)
            continue
        prep = engine.prepare(plan, mode=mode)
        assert prep.state.length == full.state.length == prep.prompt_tokens
        assert torch.isfinite(prep.state.last_logits).all()
    serving = Serving.of(engine)
    one = SamplingParams(max_tokens=2, ignore_eos=True, logprobs=True)
    ref = list(serving.generate(plan, one, mode="full_recompute"))[-1]
    list(serving.generate(plan, one, mode="prefix_cache"))
    again = list(serving.generate(plan, one, mode="prefix_cache"))[-1]
    assert again.prepared.exact_prefix_tokens == 72
    assert again.token_ids == ref.token_ids and again.logprobs == pytest.approx(ref.logprobs, abs=1e-4)
    serving.stop()  # the engine is the fixture's


def test_hypic_with_whole_segment_seams_generates_what_full_recompute_does(engine):
    """Seams covering whole segments recompute everything in context: the same state, so greedy
    decoding (scheduler + runner, decode from the pooled state) gives the same tokens."""
    plan = Plan(docs(seed=400))
    full = engine.prepare(plan, mode="full_recompute")
    composed = engine.prepare(plan, mode="hypic", seam=1.0)
    assert (composed.state.last_logits - full.state.last_logits).abs().max().item() < 1e-4
    assert greedy(engine, plan, "hypic", seam=1.0) == greedy(engine, plan, "full_recompute")


def test_hypic_reuses_segments_in_any_order(engine):
    d = docs(3, seed=700)
    engine.prepare(Plan(d), mode="hypic")
    again = engine.prepare(Plan(list(reversed(d))), mode="hypic")
    assert all(s.hit for s in again.segments)
    assert again.cached_tokens == 3 * (24 - 8)


def test_http_generate_in_every_mode(engine, tmp_path: Path):
    from hypic_agent.api.app import create_app

    settings = Settings(home=tmp_path, device="cpu", model=engine.name)
    with TestClient(create_app(settings, engine=engine), raise_server_exceptions=False) as client:
        segs = [
            {"kind": "document", "text": "Paris is the capital of France. " * 3},
            {"kind": "document", "text": "x" * 60},
        ]
        for mode in MODES:
            r = client.post("/v1/generate", json={"segments": segs, "query": "Capital?", "max_tokens": 3, "mode": mode})
            assert r.status_code == 200, (mode, r.text)
            assert r.json()["usage"]["completion_tokens"] <= 3
