"""``SHA256SUMS``: the shipped weights match theirs, and the loader refuses a changed file by name."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hypic_agent.errors import WeightsError
from hypic_agent.runtime.models.loading.catalog import BUNDLED
from hypic_agent.runtime.models.loading.checksums import CHECKSUMS, read_checksums, verify_checksums, write_checksums
from hypic_agent.runtime.models.loading.weights import load_checkpoint

SHIPPED = BUNDLED["smollm2-135m-hybrid"].folder


def test_shipped_weights_match_their_checksums() -> None:
    """Every shipped file is listed and matches; nothing else ships; the folder stays small."""
    names = verify_checksums(SHIPPED)
    on_disk = sorted(p.name for p in SHIPPED.iterdir() if p.name != CHECKSUMS)
    assert sorted(names) == on_disk
    assert {"config.json", "model.safetensors.index.json", "tokenizer.json", "distill.json"} <= set(names)
    assert sum(1 for n in names if n.endswith(".safetensors")) == 5
    assert "train.log" not in names
    # int8 mixers of 15 GDN + 15 attention layers and the tokenizer (v3, 2026-12-08: 69 MB)
    assert sum((SHIPPED / n).stat().st_size for n in names) < 72_000_000


def test_a_changed_file_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    for name in ("config.json", "tokenizer_config.json"):
        shutil.copy(SHIPPED / name, folder / name)
    write_checksums(folder)
    assert verify_checksums(folder) == ["config.json", "tokenizer_config.json"]
    with (folder / "tokenizer_config.json").open("a") as f:
        f.write(" ")
    with pytest.raises(WeightsError, match=r"tokenizer_config\.json has sha256 .* but SHA256SUMS says"):
        verify_checksums(folder)
    with pytest.raises(WeightsError, match=r"tokenizer_config\.json has sha256"):  # before any weight is read
        load_checkpoint(folder)
    (folder / "tokenizer_config.json").unlink()
    with pytest.raises(WeightsError, match=r"tokenizer_config\.json is missing"):
        verify_checksums(folder)


def test_checksum_file_format(tmp_path: Path) -> None:
    (tmp_path / CHECKSUMS).write_text(f"{'a' * 64}  x.bin\n\n{'B' * 64}  *y.bin\n")
    assert read_checksums(tmp_path) == {"x.bin": "a" * 64, "y.bin": "b" * 64}
    (tmp_path / CHECKSUMS).write_text("nonsense\n")
    with pytest.raises(WeightsError, match="line 1"):
        read_checksums(tmp_path)
