"""Model fingerprint: architecture + weights digest + dtype, the model part of every segment key.

``model_fingerprint`` returns ``"<model_type>:<dtype>:<32 hex>"`` where the hex digest is
``xxh3_128`` over the normalized config (``HybridConfig.to_dict()``) and then one of:

* tensors (a ``{name: Tensor}`` dict): names in sorted order, each with shape, dtype and bytes;
* weight files (paths): each file's name, size and bytes, streamed in 8 MiB blocks. With
  ``cache_dir`` a per-file digest is remembered by (path, size, mtime) so a restart does not
  re-read tens of GB;
* ``seed`` (seeded random weights, e.g. ``tiny:*``): the seed and the transformers version
  (whose init draws the weights); the weights are never read.

Two models share a fingerprint only if they compute the same function at that dtype, so cached
segment states can never be served across models. Where what an entry holds changed for a family
without its config changing, the digest also covers that layout's name (``entry_layout``: MLA
layers cache the latent form since ``mla-latent-v1``), so entries of an older layout get other
keys and are never decoded as the new one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import xxhash

from hypic_agent.runtime.models.config import HybridConfig
from hypic_agent.runtime.models.families import normalize_config

FORMAT = "hypic-fp-v1"
_BLOCK = 8 << 20


def dtype_name(dtype: torch.dtype | str | None) -> str:
    """``torch.bfloat16`` / ``"bfloat16"`` -> ``"bfloat16"``."""
    if dtype is None:
        return "native"
    return str(dtype).removeprefix("torch.")


def entry_layout(cfg: HybridConfig) -> str:
    """The name of the entry / pool layout this model's cached attention state has: ``""`` for per-head
    K/V (digests as before), ``"mla-latent-v1"`` for MLA's rope key + latent (``layers/mla.py``)."""
    return "mla-latent-v1" if cfg.mla is not None else ""


def _config_json(hf_config: HybridConfig | dict[str, Any]) -> tuple[str, str, str]:
    cfg = hf_config if isinstance(hf_config, HybridConfig) else normalize_config(hf_config)
    return cfg.model_type, json.dumps(cfg.to_dict(), sort_keys=True, default=str), entry_layout(cfg)


def tensor_digest(h: Any, name: str, t: torch.Tensor) -> None:
    """Feed one tensor (name, shape, dtype, raw bytes) into an xxhash state."""
    t = t.detach()
    h.update(f"{name}|{tuple(t.shape)}|{dtype_name(t.dtype)}|".encode())
    if t.numel():
        flat = t.contiguous().reshape(-1).view(torch.uint8)
        h.update(flat.cpu().numpy().data)


def file_digest(path: Path, cache: dict[str, Any] | None = None) -> str:
    """xxh3_128 hex of a file's bytes; ``cache`` maps ``"path"`` -> {size, mtime_ns, digest}."""
    st = path.stat()
    key = str(path.resolve())
    hit = cache.get(key) if cache is not None else None
    if hit and hit.get("size") == st.st_size and hit.get("mtime_ns") == st.st_mtime_ns:
        return str(hit["digest"])
    h = xxhash.xxh3_128()
    with path.open("rb") as f:
        while block := f.read(_BLOCK):
            h.update(block)
    digest = h.hexdigest()
    if cache is not None:
        cache[key] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "digest": digest}
    return digest


def _load_cache(cache_dir: Path | None) -> dict[str, Any] | None:
    if cache_dir is None:
        return None
    try:
        return json.loads((cache_dir / "file_digests.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _save_cache(cache_dir: Path | None, cache: dict[str, Any] | None) -> None:
    if cache_dir is None or cache is None:
        return
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = cache_dir / f"file_digests.json.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
    tmp.replace(cache_dir / "file_digests.json")


def model_fingerprint(
    hf_config: HybridConfig | dict[str, Any],
    weights: Mapping[str, torch.Tensor] | Sequence[str | Path] | None = None,
    dtype: torch.dtype | str | None = None,
    *,
    seed: int | None = None,
    init: str | None = None,
    cache_dir: Path | None = None,
) -> str:
    """``"<model_type>:<dtype>:<xxh3_128 hex>"`` for a model (see module docstring).

    Exactly one of ``weights`` (tensors or weight file paths) and ``seed`` (random weights)
    must be given. ``dtype`` is the dtype the model runs in. ``init`` names the random draws behind
    ``seed`` (default: transformers' init, keyed by its version).
    """
    if (weights is None) == (seed is None):
        raise ValueError("model_fingerprint needs exactly one of `weights` and `seed`")
    model_type, cfg_json, layout = _config_json(hf_config)
    dt = dtype_name(dtype)
    h = xxhash.xxh3_128()
    h.update(f"{FORMAT}|{dt}|{cfg_json}|".encode())
    if layout:
        h.update(f"entries|{layout}|".encode())
    if seed is not None and init is not None:
        h.update(f"random-seed|{int(seed)}|{init}".encode())
    elif seed is not None:  # random init depends on the transformers version too
        import transformers

        h.update(f"random-seed|{int(seed)}|transformers-{transformers.__version__}".encode())
    elif isinstance(weights, Mapping):
        h.update(b"tensors|")
        for name in sorted(weights):
            tensor_digest(h, name, weights[name])
    else:
        h.update(b"files|")
        cache = _load_cache(cache_dir)
        for p in sorted((Path(x) for x in weights), key=lambda q: q.name):  # type: ignore[union-attr]
            h.update(f"{p.name}|{p.stat().st_size}|{file_digest(p, cache)}|".encode())
        _save_cache(cache_dir, cache)
    return f"{model_type}:{dt}:{h.hexdigest()}"
