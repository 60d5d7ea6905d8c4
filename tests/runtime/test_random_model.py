"""``random:<config.json>``: a transformers config served at its size with seeded random weights drawn on
the device (what the GPU benchmarks and scatter workers load where no weights can be fetched)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hypic_agent.config import Settings
from hypic_agent.errors import ModelNotAvailableError
from hypic_agent.runtime.loader import load_engine
from hypic_agent.runtime.model_loader import load_model
from hypic_agent.runtime.models.loading.catalog import resolve_model
from hypic_agent.runtime.models.testing.tiny import tiny_config
from hypic_agent.runtime.results import FinishEvent
from hypic_agent.runtime.sampling import SamplingParams
from hypic_agent.runtime.serving import Serving

from .conftest import Plan, Seg


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    p = tmp_path / "config.json"
    p.write_text(json.dumps(tiny_config("qwen3_5_text")))
    return p


def _settings(tmp_path: Path, seed: int = 0) -> Settings:
    return Settings(home=tmp_path / "home", device="cpu", dtype="float32", seed=seed)


def test_resolves_and_rejects_what_is_not_a_config(tmp_path: Path, config_file: Path) -> None:
    src = resolve_model(f"random:{config_file}", _settings(tmp_path))
    assert (src.kind, src.path) == ("random", config_file)
    with pytest.raises(ModelNotAvailableError, match=r"needs a transformers config\.json"):
        resolve_model(f"random:{tmp_path / 'absent.json'}", _settings(tmp_path))
    bad = tmp_path / "bad.json"
    bad.write_text('{"hidden_size": 8}')
    with pytest.raises(ModelNotAvailableError, match="no model_type"):
        load_model(_settings(tmp_path), model=f"random:{bad}")


def test_same_seed_same_weights_other_seed_other_weights(tmp_path: Path, config_file: Path) -> None:
    spec = f"random:{config_file}"
    a, _, fp_a = load_model(_settings(tmp_path), model=spec)
    b, _, fp_b = load_model(_settings(tmp_path), model=spec)
    c, _, fp_c = load_model(_settings(tmp_path, seed=1), model=spec)
    assert fp_a == fp_b != fp_c
    pa, pb, pc = (dict(m.named_parameters()) for m in (a, b, c))
    assert all(torch.equal(pa[n], pb[n]) for n in pa)
    assert not torch.equal(pa["model.embed_tokens.weight"], pc["model.embed_tokens.weight"])
    assert a.config.num_layers == tiny_config("qwen3_5_text")["num_hidden_layers"]
    assert pa["model.embed_tokens.weight"].std().item() == pytest.approx(0.02, rel=0.1)  # the documented draw
    # the tiny model of the same config is another model: its fingerprint differs
    assert load_model(_settings(tmp_path), model="tiny:qwen3_5_text")[2] != fp_a


def test_engine_generates_with_the_byte_tokenizer(tmp_path: Path, config_file: Path) -> None:
    serving = Serving.of(load_engine(_settings(tmp_path), model=f"random:{config_file}"))
    try:
        plan = Plan([Seg(tuple(b"a cached document " * 3)), Seg(tuple(b"and another one " * 3))], list(b"q?"))
        events = list(serving.generate(plan, SamplingParams(max_tokens=4, temperature=0.0), mode="hypic"))
        finish = events[-1]
        assert isinstance(finish, FinishEvent) and finish.completion_tokens == 4
    finally:
        serving.close()
