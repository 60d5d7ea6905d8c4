"""The exported model folder: only new tensors + base reference; loads, runs and generates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hypic_agent.errors import WeightsError
from hypic_agent.runtime.models.hybrid import build_model
from hypic_agent.runtime.models.loading.weights import load_base, load_checkpoint
from hypic_agent.runtime.runner.standalone import prefill
from hypic_agent.training import delta


def test_folder_holds_only_new_tensors(tiny_run) -> None:
    cfg, _ = tiny_run
    folder = cfg.out / "model"
    raw = json.loads((folder / "config.json").read_text())
    assert raw["model_type"] == "qwen3_5_text" and raw[delta.DELTA_KEY]["base"] == {"tiny": "llama", "seed": 0}
    stored = load_file(str(folder / "model.safetensors"))
    assert stored and all("_attn." in n for n in stored)
    assert (folder / "tokenizer.json").is_file() and (folder / "distill.json").is_file()
    assert delta.is_delta_folder(folder) and not delta.is_delta_folder(folder.parent)


def test_load_delta_equals_trained_student(tiny_run) -> None:
    cfg, _ = tiny_run
    hcfg, _, tensors = delta.load_delta(cfg.out / "model")
    trained = load_file(str(cfg.out / "ckpt" / "weights.safetensors"))
    for name, t in trained.items():
        assert torch.equal(tensors[name], t), name  # float32 export: exact
    model = build_model(hcfg)
    model.load_weights(tensors)
    ids = list(range(40, 80))
    logits = prefill(model, [ids], all_logits=True)[0].all_logits
    assert torch.isfinite(logits).all()


def test_generate_cli_runs_the_folder(tiny_run, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from hypic_agent.cli import app

    cfg, _ = tiny_run
    monkeypatch.setenv("HYPIC_HOME", str(tmp_path))
    res = CliRunner().invoke(app, ["generate", "-p", "def f(x):", "--model", str(cfg.out / "model"),
                                   "--device", "cpu", "--max-tokens", "6", "--raw"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "6 tokens" in res.output or "tokens" in res.output


def test_materialized_folder_loads_in_transformers(tiny_run, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    cfg, _ = tiny_run
    full = delta.materialize(cfg.out / "model", tmp_path / "full", dtype=torch.float32)
    assert not delta.is_delta_folder(full)
    hcfg, _, tensors = load_checkpoint(full)  # plain folder: the unmodified loader reads it
    model = build_model(hcfg)
    model.load_weights(tensors)
    hf = AutoModelForCausalLM.from_pretrained(str(full), dtype=torch.float32).eval()
    ids = torch.arange(30, 70)[None]
    with torch.no_grad():
        ref = hf(ids).logits[0]
    ours = prefill(model, [ids[0].tolist()], all_logits=True)[0].all_logits
    assert (ours - ref).abs().max().item() < 1e-4


def test_base_sha256_is_checked(tmp_path: Path) -> None:
    f = tmp_path / "base.gguf"
    f.write_bytes(b"not the weights")
    with pytest.raises(WeightsError, match="sha256"):
        load_base({"path": str(f), "sha256": "0" * 64})


def test_int8_export_round_trip(tiny_run, tmp_path: Path) -> None:
    cfg, _ = tiny_run
    trained = load_file(str(cfg.out / "ckpt" / "weights.safetensors"))
    raw = json.loads((cfg.out / "model" / "config.json").read_text())
    raw.pop(delta.DELTA_KEY)
    folder = delta.export_delta(tmp_path / "q", raw, trained, {"tiny": "llama", "seed": 0}, dtype=torch.int8)
    stored = load_file(str(folder / "model.safetensors"))
    assert any(t.dtype == torch.int8 for t in stored.values())
    _, _, tensors = delta.load_delta(folder)
    for name, t in trained.items():
        err = (tensors[name].float() - t).abs().max() / t.abs().max().clamp_min(1e-12)
        assert err < 0.01, (name, float(err))
