"""``load_checkpoint``: HF folders (single file, sharded, Qwen3.5 wrapper, per-expert) and errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from hypic_agent.errors import ModelConfigError, WeightsError
from hypic_agent.runtime.models.families import normalize_config, to_contract
from hypic_agent.runtime.models.loading.catalog import ModelSource
from hypic_agent.runtime.models.loading.safetensors import weight_files
from hypic_agent.runtime.models.loading.shapes import validate_state_dict
from hypic_agent.runtime.models.loading.weights import load_checkpoint, load_weights
from hypic_agent.runtime.models.testing.tiny import TINY_ARCHS, build_hf_model, random_state_dict, tiny_config


def _save_hf(arch: str, folder: Path, shard: str | None = None, dtype: torch.dtype = torch.float32) -> dict:
    d = tiny_config(arch)
    sd = random_state_dict(d, seed=1)
    kw = {"max_shard_size": shard} if shard else {}
    build_hf_model(d, sd, dtype=dtype).save_pretrained(folder, **kw)
    return {k: v.to(dtype) for k, v in sd.items()}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert set(a) == set(b), set(a) ^ set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("arch", TINY_ARCHS)
@pytest.mark.parametrize("shard", [None, "60KB"])
def test_load_save_pretrained(arch: str, shard: str | None, tmp_path: Path) -> None:
    sd = _save_hf(arch, tmp_path, shard)
    if shard:
        assert (tmp_path / "model.safetensors.index.json").is_file() and len(weight_files(tmp_path)) > 2
    cfg, raw, tensors = load_checkpoint(tmp_path)
    assert raw["model_type"] == arch and cfg == normalize_config(tiny_config(arch))
    _same(tensors, to_contract(cfg, sd))  # transformers' names of lfm2 / granitemoehybrid renamed


def test_load_per_expert_layout_is_fused(tmp_path: Path) -> None:
    # transformers' save_pretrained writes MoE experts one tensor per expert (Qwen3-Next hub layout)
    sd = _save_hf("qwen3_next", tmp_path)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "model.layers.0.mlp.experts.3.up_proj.weight" in names
    assert "model.layers.0.mlp.experts.gate_up_proj" not in names
    _, _, tensors = load_checkpoint(tmp_path)
    gu = tensors["model.layers.0.mlp.experts.gate_up_proj"]
    assert gu.shape == (4, 64, 64)  # [E, 2I, D]: gate rows first, then up
    _same(tensors, sd)


def test_load_bf16_and_dtype_cast(tmp_path: Path) -> None:
    sd = _save_hf("qwen3_5_text", tmp_path, dtype=torch.bfloat16)
    _, _, tensors = load_checkpoint(tmp_path)
    _same(tensors, sd)
    _, _, t32 = load_checkpoint(tmp_path, dtype=torch.float32)
    assert all(t.dtype == torch.float32 for t in t32.values())


def _write_wrapper(folder: Path, *, drop: str | None = None, shard_index: bool = False) -> dict:
    """A Qwen3.5 (VL wrapper) checkpoint written by hand: text under model.language_model."""
    text = tiny_config("qwen3_5_moe_text")
    text.pop("model_type")
    tie = text.pop("tie_word_embeddings")
    conf = {"model_type": "qwen3_5_moe", "architectures": ["Qwen3_5MoeForConditionalGeneration"]}
    conf |= {"text_config": text, "vision_config": {"depth": 1}, "tie_word_embeddings": tie}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(conf))
    sd = random_state_dict(tiny_config("qwen3_5_moe_text"), seed=2)
    ckpt: dict[str, torch.Tensor] = {}
    for k, v in sd.items():
        if k == drop:
            continue
        ckpt[k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k] = v
    ckpt["model.visual.blocks.0.attn.qkv.weight"] = torch.zeros(3, 3)
    ckpt["mtp.layers.0.input_layernorm.weight"] = torch.zeros(64)
    ckpt["mtp.fc.weight"] = torch.zeros(64, 128)
    if shard_index:
        names = sorted(ckpt)
        half = len(names) // 2
        parts = {"a.safetensors": names[:half], "b.safetensors": names[half:]}
        for fname, keys in parts.items():
            save_file({k: ckpt[k].contiguous() for k in keys}, str(folder / fname))
        index = {"metadata": {}, "weight_map": {k: f for f, ks in parts.items() for k in ks}}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    else:
        save_file({k: v.contiguous() for k, v in ckpt.items()}, str(folder / "model.safetensors"))
    return sd


@pytest.mark.parametrize("shard_index", [False, True])
def test_load_qwen3_5_wrapper_layout(tmp_path: Path, shard_index: bool) -> None:
    sd = _write_wrapper(tmp_path, shard_index=shard_index)
    cfg, raw, tensors = load_checkpoint(tmp_path)
    assert raw["model_type"] == "qwen3_5_moe" and cfg.model_type == "qwen3_5_moe_text"
    assert not any(k.startswith(("model.visual", "mtp")) for k in tensors)
    _same(tensors, sd)


def test_tied_checkpoint_with_stored_lm_head(tmp_path: Path) -> None:
    d = tiny_config("llama")
    sd = random_state_dict(d, seed=0)
    (tmp_path / "config.json").write_text(json.dumps(d))
    save_file({**sd, "lm_head.weight": sd["model.embed_tokens.weight"].clone()}, str(tmp_path / "m.safetensors"))
    _, _, tensors = load_checkpoint(tmp_path)
    _same(tensors, sd)


def test_load_weights_hf_source_fingerprint(tmp_path: Path) -> None:
    _save_hf("qwen3_next", tmp_path / "m", "60KB")
    src = ModelSource(name="m", kind="hf", path=tmp_path / "m")
    a = load_weights(src, fingerprint_cache=tmp_path / "fp")
    b = load_weights(src, fingerprint_cache=tmp_path / "fp")
    assert a.fingerprint == b.fingerprint and a.fingerprint.startswith("qwen3_next:float32:")
    assert load_weights(src, dtype=torch.bfloat16).fingerprint != a.fingerprint
    tiny = load_weights(ModelSource(name="tiny:qwen3_next", kind="tiny", arch="qwen3_next"))
    assert tiny.config == a.config and tiny.fingerprint != a.fingerprint


# ---------------------------------------------------------------------------- errors
def test_error_folder_missing(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match="does not exist"):
        load_checkpoint(tmp_path / "nope")


def test_error_no_config(tmp_path: Path) -> None:
    with pytest.raises(ModelConfigError, match=r"config\.json"):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize("model_type", ["mamba2", "zamba2", "jamba", "glm5_next"])
def test_error_unknown_model_type_names_the_supported_ones(tmp_path: Path, model_type: str) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    with pytest.raises(ModelConfigError, match="unknown model_type") as e:
        load_checkpoint(tmp_path)
    for supported in (
        "qwen3_5",
        "qwen3_next",
        "llama",
        "lfm2",
        "granitemoehybrid",
        "nemotron_h",
        "minimax",
        "kimi_linear",
        "bailing_moe_linear",
        "bailing_hybrid",
        "falcon_h1",
    ):
        assert repr(supported) in e.value.message


def test_error_no_weight_files(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(tiny_config("llama")))
    (tmp_path / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(WeightsError, match=r"no \*\.safetensors"):
        load_checkpoint(tmp_path)


def test_error_missing_tensor(tmp_path: Path) -> None:
    _write_wrapper(tmp_path, drop="model.layers.3.self_attn.k_norm.weight")
    with pytest.raises(WeightsError, match=r"missing.*layers\.3\.self_attn\.k_norm"):
        load_checkpoint(tmp_path)


def test_error_missing_expert(tmp_path: Path) -> None:
    _save_hf("qwen3_next", tmp_path)
    from safetensors.torch import load_file

    sd = load_file(str(tmp_path / "model.safetensors"))
    del sd["model.layers.2.mlp.experts.1.down_proj.weight"]
    save_file(sd, str(tmp_path / "model.safetensors"))
    with pytest.raises(WeightsError, match=r"layers\.2\.mlp\.experts: down_proj of expert\(s\) \[1\]"):
        load_checkpoint(tmp_path)


def test_error_shape_mismatch(tmp_path: Path) -> None:
    _save_hf("llama", tmp_path)
    conf = json.loads((tmp_path / "config.json").read_text())
    conf["intermediate_size"] = 96
    (tmp_path / "config.json").write_text(json.dumps(conf))
    with pytest.raises(WeightsError, match=r"shape.*mlp\.gate_proj\.weight: \(128, 64\) != \(96, 64\)"):
        load_checkpoint(tmp_path)


def test_error_index_points_at_missing_shard(tmp_path: Path) -> None:
    _save_hf("qwen3_5_text", tmp_path, "60KB")
    victim = sorted(tmp_path.glob("model-*.safetensors"))[1]
    victim.unlink()
    with pytest.raises(WeightsError, match=f"missing: \\['{victim.name}'\\]"):
        load_checkpoint(tmp_path)


def test_error_corrupt_file(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(tiny_config("llama")))
    (tmp_path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}......")
    with pytest.raises(WeightsError, match="corrupt"):
        load_checkpoint(tmp_path)


def test_validate_state_dict_reports_extra() -> None:
    d = tiny_config("llama")
    sd = random_state_dict(d, seed=0)
    cfg = normalize_config(d)
    assert validate_state_dict(cfg, {**sd, "foo": torch.zeros(1)}) == ["foo"]
