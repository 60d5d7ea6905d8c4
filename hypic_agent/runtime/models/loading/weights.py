"""Loading any model source: config + tensors under the naming contract (+ fingerprint).

``load_weights(source)`` for a ``catalog.ModelSource``: ``tiny:<arch>`` (seeded weights, ``testing/``),
a ``.gguf`` file (``gguf.load_gguf``) or a local HF folder (``load_checkpoint``). A folder with
``SHA256SUMS`` (the package's shipped weights, ``checksums``) is checked first; a distilled delta
folder (``delta``: the stored tensors only) is loaded on top of the base weights it names
(``load_delta``, ``load_base``), any other folder as it is (``safetensors.load_folder``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hypic_agent.config import Settings
from hypic_agent.errors import ModelConfigError, WeightsError
from hypic_agent.runtime.models.config import HybridConfig
from hypic_agent.runtime.models.families import normalize_config, to_contract
from hypic_agent.runtime.models.loading.catalog import ModelSource, resolve_model
from hypic_agent.runtime.models.loading.checksums import CHECKSUMS, cached_file_sha256, verify_checksums
from hypic_agent.runtime.models.loading.delta import DELTA_KEY, MAPPING_NAME, derived_tensors, unpack
from hypic_agent.runtime.models.loading.fingerprint import model_fingerprint
from hypic_agent.runtime.models.loading.gguf import load_gguf
from hypic_agent.runtime.models.loading.safetensors import load_folder, read_hf_config, weight_files
from hypic_agent.runtime.models.loading.shapes import validate_state_dict
from hypic_agent.runtime.models.testing.tiny import random_state_dict, tiny_config


# ---------------------------------------------------------------------------- HF folders
def load_checkpoint(
    folder: str | Path,
    *,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    settings: Settings | None = None,
) -> tuple[HybridConfig, dict[str, Any], dict[str, torch.Tensor]]:
    """Load a local HF folder: ``(HybridConfig, raw config.json dict, tensors by contract name)``.

    ``dtype`` casts floating tensors; ``device`` is where they are materialized. A folder with
    ``SHA256SUMS`` (the package's shipped weights) is checked against it first; ``settings`` says
    where a delta folder's base weights are (``Settings()`` when None).
    """
    folder = Path(folder).expanduser()
    raw_cfg = read_hf_config(folder)
    if (folder / CHECKSUMS).is_file():
        verify_checksums(folder)
    if DELTA_KEY in raw_cfg:  # a distilled model: base weights + stored tensors (delta.py)
        return load_delta(folder, raw_cfg, dtype=dtype, device=device, settings=settings)
    return load_folder(folder, raw_cfg, dtype=dtype, device=device)


def load_delta(
    folder: str | Path,
    raw_cfg: dict[str, Any] | None = None,
    *,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    settings: Settings | None = None,
) -> tuple[HybridConfig, dict[str, Any], dict[str, torch.Tensor]]:
    """Like ``load_checkpoint`` for a delta folder: base weights + stored tensors.

    Returns ``(HybridConfig, config.json dict, tensors by contract name)`` on ``device`` in ``dtype``
    (stored dtype when None).
    """
    from safetensors.torch import load_file

    folder = Path(folder).expanduser()
    raw_cfg = raw_cfg if raw_cfg is not None else read_hf_config(folder)
    meta = raw_cfg.get(DELTA_KEY)
    if not isinstance(meta, dict) or "base" not in meta:
        raise ModelConfigError(f"{folder}/config.json has no '{DELTA_KEY}' section with a base reference")
    if meta.get("mapping") != MAPPING_NAME:
        raise ModelConfigError(
            f"{folder} was written with mapping {meta.get('mapping')!r}; this version reads {MAPPING_NAME!r}"
        )
    cfg = normalize_config(raw_cfg)
    _, base_tensors = load_base(meta["base"], settings)
    stored: dict[str, torch.Tensor] = {}
    for f in weight_files(folder):
        stored.update(load_file(str(f)))
    stored = unpack(stored)
    tensors = derived_tensors(base_tensors, cfg.tie_word_embeddings)
    saved_as = raw_cfg.get("dtype")
    dt = dtype or (getattr(torch, saved_as) if saved_as in ("bfloat16", "float16", "float32") else torch.float32)
    tensors.update(stored)
    extra = validate_state_dict(cfg, tensors, where=str(folder))
    for n in extra:
        del tensors[n]
    out = {k: v.to(device=device, dtype=dt if v.is_floating_point() else v.dtype) for k, v in tensors.items()}
    return cfg, raw_cfg, out


def load_base(base: dict[str, Any], settings: Settings | None = None) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(HF config, fp32 tensors) of the weights a base reference names (checks sha256)."""
    if "tiny" in base:
        raw = tiny_config(base["tiny"])
        return raw, random_state_dict(raw, int(base.get("seed", 0)))
    settings = settings or Settings()
    if "catalog" in base:
        src = resolve_model(base["catalog"], settings)
        path = src.path
    else:
        path = Path(base["path"]).expanduser()
    assert path is not None
    if path.is_file():
        want = base.get("sha256")
        if want and cached_file_sha256(path) != want:
            raise WeightsError(
                f"base weights {path} have sha256 {cached_file_sha256(path)}, but the distilled model was trained on "
                f"{want}; put the right file there (`hypic-agent models fetch {base.get('catalog', '')}`)"
            )
        _, raw, tensors = load_gguf(path, dtype=torch.float32)
        return raw, tensors
    _, raw, tensors = load_checkpoint(path, dtype=torch.float32)
    return raw, tensors


@dataclass
class LoadedWeights:
    """What ``load_weights`` returns: tensors under the naming contract plus identity."""

    source: ModelSource
    config: HybridConfig
    hf_config: dict[str, Any]
    tensors: dict[str, torch.Tensor] = field(repr=False)
    fingerprint: str


# ---------------------------------------------------------------------------- any source
def load_weights(
    source: ModelSource,
    *,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    seed: int = 0,
    fingerprint_cache: Path | None = None,
    settings: Settings | None = None,
) -> LoadedWeights:
    """Config + tensors (naming contract) + fingerprint of a resolved source."""
    if source.kind == "tiny":
        raw = tiny_config(source.arch or "qwen3_5_text")
        dt = dtype or torch.float32
        cfg = normalize_config(raw)
        tensors = to_contract(cfg, {k: v.to(device) for k, v in random_state_dict(raw, seed, dt).items()})
        fp = model_fingerprint(cfg, dtype=dt, seed=seed)
        return LoadedWeights(source, cfg, raw, tensors, fp)
    assert source.path is not None
    if source.kind == "gguf":
        cfg, raw, tensors = load_gguf(source.path, dtype=dtype, device=device)
        files = [source.path]
    else:
        cfg, raw, tensors = load_checkpoint(source.path, dtype=dtype, device=device, settings=settings)
        files = weight_files(source.path)
    dt = dtype or tensors["model.embed_tokens.weight"].dtype
    fp = model_fingerprint(cfg, files, dtype=dt, cache_dir=fingerprint_cache)
    return LoadedWeights(source, cfg, raw, tensors, fp)
