"""Writing the distilled model: a Hugging Face folder holding only what the base model lacks.

The folder's format (``DELTA_KEY`` section, int8 group scales, the mapping that rebuilds the rest from
the base) is ``runtime/models/loading/delta.py``; the runtime reads it (``loading.weights.load_delta``,
which ``load_checkpoint`` calls for folders whose config.json has ``hypic_delta``). Here: ``pack`` and
``export_delta`` write one; ``materialize`` writes a self-contained folder (all tensors) that
transformers' ``Qwen3_5ForCausalLM.from_pretrained`` loads too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from hypic_agent.runtime.models.loading.delta import DELTA_KEY, MAPPING_NAME, QSCALE
from hypic_agent.runtime.models.loading.weights import load_delta

QGROUP = 64  # int8 export: one scale per QGROUP consecutive weights of a row


def pack(tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Tensors as stored: cast to ``dtype``; for ``torch.int8`` symmetric group-wise quantization of
    every matrix (groups of ``QGROUP`` along each row, scale = group absmax / 127 in fp32, so
    about 8.5 bits per weight); vectors and short rows (the GDN conv taps) stay bf16. The runtime's
    ``loading.delta.unpack`` inverts it."""
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
