"""Moving files through the GPU machine's size limits: split / join, repack, tokenizer re-attach."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from hypic_agent.errors import WeightsError
from hypic_agent.training import delta
from hypic_agent.training.transfer import attach_tokenizer, join_parts, repack, split_file


def test_split_join_checks_sha256(tmp_path: Path) -> None:
    src = tmp_path / "blob.bin"
    data = bytes(range(256)) * 1000
    src.write_bytes(data)
    parts = split_file(src, tmp_path / "parts", 100_000)
    assert [p.stat().st_size for p in parts] == [100_000, 100_000, 56_000]
    out = join_parts(parts, tmp_path / "joined.bin", hashlib.sha256(data).hexdigest())
    assert out.read_bytes() == data
    with pytest.raises(WeightsError, match="sha256"):
        join_parts(parts[:2], tmp_path / "bad.bin", hashlib.sha256(data).hexdigest())
    assert not (tmp_path / "bad.bin").exists()


def test_repack_int8_then_attach_tokenizer(tiny_run, tmp_path: Path) -> None:
    cfg, _ = tiny_run
    dst = repack(cfg.out / "model", tmp_path / "q", dtype="int8", shard_mb=0.05, tokenizer=False)
    assert not (dst / "tokenizer.json").exists() and (dst / "model.safetensors.index.json").is_file()
    attach_tokenizer(dst)
    assert (dst / "tokenizer.json").is_file()
    _, _, a = delta.load_delta(cfg.out / "model")
    _, _, b = delta.load_delta(dst)
    for name in a:
        err = (a[name].float() - b[name].float()).abs().max() / a[name].float().abs().max().clamp_min(1e-12)
        assert err < 0.01, name
    assert b["model.layers.0.linear_attn.conv1d.weight"].dtype == torch.float32
