"""The distilled model on disk: a Hugging Face folder holding only what the base model lacks.

::

    config.json              qwen3_5_text config + "hypic_delta": {base, mapping, files}
    model*.safetensors       the new / changed tensors (mixers), shards of at most ``shard_mb``
    tokenizer.json, ...      the teacher's tokenizer (+ chat template)
    distill.json             training summary and held-out metrics

``base`` names the teacher weights (catalog name + sha256 of the GGUF, or a path, or the tiny
seed); everything not stored (embeddings, MLPs, norms) is rebuilt from it by the fixed mapping
``convert.derived_tensors``. ``load_delta`` is the loader hook: ``runtime/models/loading.py``'s
``load_checkpoint`` calls it for folders whose config.json has ``hypic_delta``.
``materialize`` writes a self-contained folder (all tensors) that transformers'
``Qwen3_5ForCausalLM.from_pretrained`` loads too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from hypic_agent.config import Settings
from hypic_agent.errors import ModelConfigError
from hypic_agent.runtime.models.config import HybridConfig
from hypic_agent.training.convert import MAPPING_NAME, derived_tensors

DELTA_KEY = "hypic_delta"
QSCALE = ".qscale"  # int8 export: scales of tensor ``name`` stored as ``name + QSCALE``
QGROUP = 64  # int8 export: one scale per QGROUP consecutive weights of a row


def pack(tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Tensors as stored: cast to ``dtype``; for ``torch.int8`` symmetric group-wise quantization of
    every matrix (groups of ``QGROUP`` along each row, scale = group absmax / 127 in fp32, so
    about 8.5 bits per weight); vectors and short rows (the GDN conv taps) stay bf16."""
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        t = t.detach().to("cpu", torch.float32)
        if dtype != torch.int8:
            out[name] = t.to(dtype).contiguous()
        elif t.dim() < 2 or t[0].numel() < QGROUP:  # vectors, conv taps: bf16 (small, sensitive)
            out[name] = t.to(torch.bfloat16).contiguous()
        else:
            rows = t.reshape(t.shape[0], -1)
            group = QGROUP if rows.shape[1] % QGROUP == 0 else rows.shape[1]
            g = rows.view(rows.shape[0], -1, group)
            scale = g.abs().amax(dim=-1).clamp_min(1e-12) / 127.0  # [rows, groups]
            out[name] = torch.round(g / scale[..., None]).to(torch.int8).reshape(t.shape).contiguous()
            out[name + QSCALE] = scale.contiguous()
    return out


def unpack(stored: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Inverse of ``pack`` (int8 matrices dequantized to fp32; other tensors as stored)."""
    out: dict[str, torch.Tensor] = {}
    for name, t in stored.items():
        if name.endswith(QSCALE):
            continue
        scale = stored.get(name + QSCALE)
        if scale is not None:
            g = t.reshape(t.shape[0], scale.shape[1], -1).float()
            t = (g * scale[..., None].float()).reshape(t.shape)
        out[name] = t
    return out


def _shards(tensors: dict[str, torch.Tensor], shard_bytes: int) -> list[dict[str, torch.Tensor]]:
    out: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in sorted(tensors):
        t = tensors[name]
        nbytes = t.numel() * t.element_size()
        if out[-1] and size + nbytes > shard_bytes:
            out.append({})
            size = 0
        out[-1][name] = t
        size += nbytes
    return out


def write_weights(folder: Path, tensors: dict[str, torch.Tensor], *, shard_mb: float = 0) -> list[str]:
    """``model.safetensors`` or shards + ``model.safetensors.index.json``; returns the file names."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in [*folder.glob("model*.safetensors"), folder / "model.safetensors.index.json"]:
        old.unlink(missing_ok=True)
    parts = _shards(tensors, int(shard_mb * (1 << 20))) if shard_mb > 0 else [tensors]
    if len(parts) == 1:
        save_file(parts[0], str(folder / "model.safetensors"), metadata={"format": "pt"})
        return ["model.safetensors"]
    names = [f"model-{i + 1:05d}-of-{len(parts):05d}.safetensors" for i in range(len(parts))]
    weight_map: dict[str, str] = {}
    for part, fname in zip(parts, names, strict=True):
        save_file(part, str(folder / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, fname))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    return names


def export_delta(
    folder: Path,
    student_config: dict[str, Any],
    tensors: dict[str, torch.Tensor],
    base: dict[str, Any],
    *,
    tokenizer: Any = None,
    dtype: torch.dtype = torch.bfloat16,
    shard_mb: float = 0,
    summary: dict[str, Any] | None = None,
) -> Path:
    """Write the distilled model folder. ``tensors``: what the base lacks (mixers, trained tensors).

    ``dtype``: storage type (bfloat16 by default; ``torch.int8`` = group-wise int8, ~0.53x the size)."""
    cfg = dict(student_config)
    cfg["dtype"] = str(dtype).removeprefix("torch.")
    files = write_weights(folder, pack(tensors, dtype), shard_mb=shard_mb)
    cfg[DELTA_KEY] = {"base": base, "mapping": MAPPING_NAME, "files": files}
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(folder))
    if summary is not None:
        (folder / "distill.json").write_text(json.dumps(summary, indent=1))
    return folder


def is_delta_folder(folder: str | Path) -> bool:
    path = Path(folder) / "config.json"
    return path.is_file() and DELTA_KEY in json.loads(path.read_text())


def load_delta(
    folder: str | Path,
    raw_cfg: dict[str, Any] | None = None,
    *,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    settings: Settings | None = None,
) -> tuple[HybridConfig, dict[str, Any], dict[str, torch.Tensor]]:
    """Like ``loading.load_checkpoint`` for a delta folder: base weights + stored tensors.

    Returns ``(HybridConfig, config.json dict, tensors by contract name)`` on ``device`` in ``dtype``
    (stored dtype when None).
    """
    from safetensors.torch import load_file

    from hypic_agent.runtime.models.loading import read_hf_config, validate_state_dict, weight_files
    from hypic_agent.training.teacher import load_base

    folder = Path(folder).expanduser()
    raw_cfg = raw_cfg if raw_cfg is not None else read_hf_config(folder)
    meta = raw_cfg.get(DELTA_KEY)
    if not isinstance(meta, dict) or "base" not in meta:
        raise ModelConfigError(f"{folder}/config.json has no '{DELTA_KEY}' section with a base reference")
    if meta.get("mapping") != MAPPING_NAME:
        raise ModelConfigError(
            f"{folder} was written with mapping {meta.get('mapping')!r}; this version reads {MAPPING_NAME!r}"
        )
    cfg = HybridConfig.from_hf(raw_cfg)
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


def materialize(folder: str | Path, out: str | Path, *, dtype: torch.dtype = torch.bfloat16) -> Path:
    """A self-contained copy of a delta folder (every tensor stored; no base reference)."""
    import shutil

    folder, out = Path(folder), Path(out)
    _, raw_cfg, tensors = load_delta(folder, dtype=dtype)
    out.mkdir(parents=True, exist_ok=True)
    for f in folder.iterdir():
        if f.is_file() and not f.name.startswith("model") and f.name != "config.json":
            shutil.copy2(f, out / f.name)
    cfg = {k: v for k, v in raw_cfg.items() if k != DELTA_KEY}
    cfg["dtype"] = str(dtype).removeprefix("torch.")
    if cfg.get("tie_word_embeddings"):
        tensors.pop("lm_head.weight", None)
    write_weights(out, tensors)
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    return out
