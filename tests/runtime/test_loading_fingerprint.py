"""``model_fingerprint``: tensors, weight files (streamed, cached), seeded random weights."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from hypic_agent.runtime.models.loading.fingerprint import file_digest, model_fingerprint
from hypic_agent.runtime.models.testing.tiny import random_state_dict, tiny_config

CFG = tiny_config("llama")


@pytest.fixture(scope="module")
def sd() -> dict[str, torch.Tensor]:
    return random_state_dict(CFG, seed=0)


def test_tensor_fingerprint(sd: dict[str, torch.Tensor]) -> None:
    fp = model_fingerprint(CFG, sd, torch.float32)
    assert fp.startswith("llama:float32:") and len(fp.rsplit(":", 1)[1]) == 32
    assert model_fingerprint(CFG, dict(reversed(list(sd.items()))), "float32") == fp  # order-free
    changed = dict(sd)
    w = changed["model.layers.2.mlp.up_proj.weight"].clone()
    w[3, 5] += 1e-6
    changed["model.layers.2.mlp.up_proj.weight"] = w
    assert model_fingerprint(CFG, changed, torch.float32) != fp
    renamed = dict(sd)
    renamed["x"] = renamed.pop("model.norm.weight")
    assert model_fingerprint(CFG, renamed, torch.float32) != fp
    assert model_fingerprint(CFG, sd, torch.bfloat16) != fp  # run dtype is part of it
    bf = {k: v.bfloat16() for k, v in sd.items()}
    assert model_fingerprint(CFG, bf, torch.bfloat16) != model_fingerprint(CFG, sd, torch.bfloat16)
    other = dict(CFG, rope_parameters={"rope_type": "default", "rope_theta": 5000.0})
    assert model_fingerprint(other, sd, torch.float32) != fp  # config is part of it


def test_seed_fingerprint() -> None:
    a = model_fingerprint(CFG, dtype="float32", seed=0)
    assert a == model_fingerprint(CFG, dtype=torch.float32, seed=0)
    assert a != model_fingerprint(CFG, dtype="float32", seed=1)
    assert a != model_fingerprint(tiny_config("qwen3_5_text"), dtype="float32", seed=0)
    with pytest.raises(ValueError):
        model_fingerprint(CFG, dtype="float32")
    with pytest.raises(ValueError):
        model_fingerprint(CFG, {}, dtype="float32", seed=0)


def test_file_fingerprint_and_cache(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    data = os.urandom(3 << 20)
    for d in (a, b):
        (d / "model-1.safetensors").write_bytes(data)
        (d / "model-2.safetensors").write_bytes(data[:1000])
    fa = model_fingerprint(CFG, sorted(a.glob("*")), "bfloat16", cache_dir=tmp_path / "c")
    fb = model_fingerprint(CFG, list(b.glob("*")), "bfloat16")
    assert fa == fb  # content, not location
    cache = json.loads((tmp_path / "c" / "file_digests.json").read_text())
    assert len(cache) == 2
    (b / "model-2.safetensors").write_bytes(data[:999] + bytes([data[999] ^ 1]))  # always a different last byte
    assert model_fingerprint(CFG, list(b.glob("*")), "bfloat16") != fa
    # a cached digest is reused while (size, mtime) are unchanged: prove it by planting one
    key = str((a / "model-1.safetensors").resolve())
    cache[key]["digest"] = "planted"
    assert file_digest(a / "model-1.safetensors", cache) == "planted"
    os.utime(a / "model-1.safetensors", ns=(1, 1))
    assert file_digest(a / "model-1.safetensors", cache) != "planted"
