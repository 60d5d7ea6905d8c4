"""A local Hugging Face folder's files: ``config.json``, the safetensors shards and their names.

The naming contract is transformers' ``*ForCausalLM`` text state dict (``model.embed_tokens.weight``,
``model.layers.{i}.linear_attn.in_proj_qkv.weight``, ``model.layers.{i}.mlp.experts.gate_up_proj``
``[E, 2I, D]``, ...; ``lm_head.weight`` absent when tied). Checkpoint layouts differ from it:

* Qwen3.5 wrapper checkpoints: ``model.language_model.*`` (-> ``model.*``), plus ``model.visual.*``
  and ``mtp.*`` tensors we do not run (dropped);
* MoE checkpoints with one tensor per expert ``mlp.experts.{e}.{gate,up,down}_proj.weight``
  (fused here into ``gate_up_proj [E, 2I, D]`` = cat(gate, up) and ``down_proj [E, D, I]``);
* tied checkpoints that still store ``lm_head.weight`` (dropped);
* the families whose transformers modules are named otherwise (renamed by their family module,
  ``families.to_contract``).

``weights.load_checkpoint`` loads a folder (checksums first; a distilled delta folder on its base).
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import torch

from hypic_agent.errors import ModelConfigError, WeightsError
from hypic_agent.runtime.models.config import HybridConfig
from hypic_agent.runtime.models.families import expert_name, normalize_config, to_contract
from hypic_agent.runtime.models.loading.shapes import validate_state_dict

log = logging.getLogger(__name__)

_DROP = re.compile(r"^(model\.visual\.|visual\.|mtp\.|model\.mtp\.)|\.rotary_emb\.inv_freq$")
_EXPERT = re.compile(r"^(?P<pre>model\.layers\.\d+\.mlp\.experts)\.(?P<e>\d+)\.(?P<w>gate|up|down)_proj\.weight$")


def read_hf_config(folder: str | Path) -> dict[str, Any]:
    """``config.json`` of a local model folder as a dict (wrapper configs left as they are)."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise WeightsError(f"model folder {str(folder)!r} does not exist; pass an existing local folder", param="model")
    path = folder / "config.json"
    if not path.is_file():
        raise ModelConfigError(
            f"{folder} has no config.json; pass the folder that holds config.json and the *.safetensors files",
            param="model",
        )
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ModelConfigError(f"{path} is not valid JSON: {e}") from e


def weight_files(folder: str | Path) -> list[Path]:
    """The safetensors files of a folder: those named by ``model.safetensors.index.json`` or all."""
    folder = Path(folder).expanduser()
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError) as e:
            raise WeightsError(f"{index} is corrupt ({e}); re-download it with the shards") from e
        files = [folder / n for n in names]
        absent = [f.name for f in files if not f.is_file()]
        if absent:
            raise WeightsError(
                f"{index.name} in {folder} names shard(s) that are missing: {absent[:5]}; "
                "download the missing shards (or remove the stale index file)"
            )
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise WeightsError(
            f"no *.safetensors weight files in {folder}; download the weights (only safetensors are "
            "supported: convert .bin checkpoints with transformers' save_pretrained)"
        )
    return files


def map_checkpoint_names(raw: dict[str, torch.Tensor], cfg: HybridConfig) -> dict[str, torch.Tensor]:
    """Checkpoint names -> naming contract (prefix strip, drops, per-expert fusion, tying)."""
    out: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[str, dict[int, torch.Tensor]]] = {}
    for name, t in raw.items():
        if name.startswith("model.language_model."):
            name = "model." + name[len("model.language_model.") :]
        if _DROP.search(name):
            continue
        name = expert_name(cfg, name)
        m = _EXPERT.match(name)
        if m:
            experts.setdefault(m["pre"], {}).setdefault(m["w"], {})[int(m["e"])] = t
            continue
        out[name] = t
    for pre, parts in experts.items():
        out.update(_fuse_experts(pre, parts, cfg.num_experts))
    out = to_contract(cfg, out)
    if cfg.tie_word_embeddings:
        out.pop("lm_head.weight", None)
    return out


def _fuse_experts(pre: str, parts: dict[str, dict[int, torch.Tensor]], num_experts: int) -> dict[str, torch.Tensor]:
    """``{gate,up,down}: {e: [I, D] / [D, I]}`` -> ``gate_up_proj [E, 2I, D]``, ``down_proj [E, D, I]``."""
    for w in ("gate", "up", "down"):
        have = parts.get(w, {})
        lost = [e for e in range(num_experts) if e not in have]
        if lost:
            raise WeightsError(
                f"{pre}: {w}_proj of expert(s) {lost[:8]} missing ({len(have)} of {num_experts} present); "
                "the checkpoint is incomplete or num_experts in config.json is wrong"
            )
    try:
        gate = torch.stack([parts["gate"][e] for e in range(num_experts)])
        up = torch.stack([parts["up"][e] for e in range(num_experts)])
        down = torch.stack([parts["down"][e] for e in range(num_experts)])
        return {pre + ".gate_up_proj": torch.cat([gate, up], dim=1), pre + ".down_proj": down}
    except RuntimeError as e:  # experts of different shapes
        raise WeightsError(
            f"{pre}: per-expert tensors have inconsistent shapes ({e}); the checkpoint is corrupt"
        ) from e


def load_folder(
    folder: Path,
    raw_cfg: dict[str, Any],
    *,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
) -> tuple[HybridConfig, dict[str, Any], dict[str, torch.Tensor]]:
    """The tensors of a plain HF folder whose ``config.json`` is ``raw_cfg``: ``(HybridConfig, raw_cfg,
    tensors by contract name)``. Shards are opened lazily with ``safe_open``; tensors we do not run
    (vision tower, MTP head) are never read. ``dtype`` casts floating tensors; ``device`` is where they
    are materialized. ``weights.load_checkpoint`` is the entry point (checksums, delta folders)."""
    from safetensors import SafetensorError, safe_open

    cfg = normalize_config(raw_cfg)
    raw: dict[str, torch.Tensor] = {}
    for f in weight_files(folder):
        try:
            with safe_open(str(f), framework="pt", device=str(device)) as sf:
                for name in sf.keys():  # noqa: SIM118 (safe_open is not a Mapping)
                    short = name.replace("model.language_model.", "model.", 1)
                    if _DROP.search(short) or (cfg.tie_word_embeddings and short == "lm_head.weight"):
                        continue
                    t = sf.get_tensor(name)
                    if dtype is not None and t.is_floating_point():
                        t = t.to(dtype)
                    raw[name] = t
        except (SafetensorError, OSError) as e:
            raise WeightsError(f"cannot read {f}: {e}; the file is corrupt or truncated, re-download it") from e
    tensors = map_checkpoint_names(raw, cfg)
    extra = validate_state_dict(cfg, tensors, where=str(folder))
    if extra:
        log.warning("ignoring %d unexpected tensor(s) in %s, e.g. %s", len(extra), folder, extra[:5])
        for n in extra:
            del tensors[n]
    return cfg, raw_cfg, tensors
