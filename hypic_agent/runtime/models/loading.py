"""Load weights from a local Hugging Face folder into the naming contract.

The naming contract is transformers' ``*ForCausalLM`` text state dict (``model.embed_tokens.weight``,
``model.layers.{i}.linear_attn.in_proj_qkv.weight``, ``model.layers.{i}.mlp.experts.gate_up_proj``
``[E, 2I, D]``, ...; ``lm_head.weight`` absent when tied). Checkpoint layouts differ from it:

* Qwen3.5 wrapper checkpoints: ``model.language_model.*`` (-> ``model.*``), plus ``model.visual.*``
  and ``mtp.*`` tensors we do not run (dropped);
* MoE checkpoints with one tensor per expert ``mlp.experts.{e}.{gate,up,down}_proj.weight``
  (fused here into ``gate_up_proj [E, 2I, D]`` = cat(gate, up) and ``down_proj [E, D, I]``);
* tied checkpoints that still store ``lm_head.weight`` (dropped).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from hypic_agent.errors import ModelConfigError, WeightsError
from hypic_agent.runtime.models.config import MIXER_KIND_FAMILIES, HybridConfig
from hypic_agent.runtime.models.keymap import expert_name, to_contract

if TYPE_CHECKING:
    from hypic_agent.config import Settings
    from hypic_agent.runtime.models.catalog import ModelSource

log = logging.getLogger(__name__)

Shape = tuple[int, ...]
_DROP = re.compile(r"^(model\.visual\.|visual\.|mtp\.|model\.mtp\.)|\.rotary_emb\.inv_freq$")
_EXPERT = re.compile(r"^(?P<pre>model\.layers\.\d+\.mlp\.experts)\.(?P<e>\d+)\.(?P<w>gate|up|down)_proj\.weight$")


# ---------------------------------------------------------------------------- expected shapes
def expected_shapes(cfg: HybridConfig) -> dict[str, Shape]:
    """Every tensor name of the naming contract for ``cfg`` with its shape (the families named in
    ``keymap``: read off the model built on the meta device)."""
    if cfg.family in MIXER_KIND_FAMILIES:
        from hypic_agent.runtime.models.registry import build_model

        shapes = {k: tuple(t.shape) for k, t in build_model(cfg, device="meta").state_dict().items()}
        if cfg.tie_word_embeddings:
            shapes.pop("lm_head.weight", None)
        return shapes
    d, v = cfg.hidden_size, cfg.vocab_size
    out: dict[str, Shape] = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,)}
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = (v, d)
    for i, kind in enumerate(cfg.layer_types):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = (d,)
        out[p + "post_attention_layernorm.weight"] = (d,)
        if kind == "linear":
            out.update(_linear_shapes(cfg, p + "linear_attn."))
        else:
            out.update(_attention_shapes(cfg, p + "self_attn."))
        moe = bool(cfg.moe_layers[i]) if cfg.moe_layers else False
        out.update(_moe_shapes(cfg, p + "mlp.") if moe else _mlp_shapes(d, cfg.intermediate_size, p + "mlp."))
    return out


def _linear_shapes(cfg: HybridConfig, p: str) -> dict[str, Shape]:
    d, hv, kd, vd = cfg.hidden_size, cfg.linear_num_value_heads, cfg.linear_key_dim, cfg.linear_value_dim
    out: dict[str, Shape] = {}
    if cfg.linear_fused_qkvz:
        out[p + "in_proj_qkvz.weight"] = (2 * kd + 2 * vd, d)
        out[p + "in_proj_ba.weight"] = (2 * hv, d)
    else:
        out[p + "in_proj_qkv.weight"] = (cfg.linear_conv_dim, d)
        out[p + "in_proj_z.weight"] = (vd, d)
        out[p + "in_proj_b.weight"] = (hv, d)
        out[p + "in_proj_a.weight"] = (hv, d)
    out[p + "conv1d.weight"] = (cfg.linear_conv_dim, 1, cfg.linear_conv_kernel_dim)
    out[p + "A_log"] = (hv,)
    out[p + "dt_bias"] = (hv,)
    out[p + "norm.weight"] = (cfg.linear_value_head_dim,)
    out[p + "out_proj.weight"] = (d, vd)
    return out


def _attention_shapes(cfg: HybridConfig, p: str) -> dict[str, Shape]:
    d, hd = cfg.hidden_size, cfg.head_dim
    q_out = cfg.num_attention_heads * hd * (2 if cfg.attn_output_gate else 1)
    kv_out = cfg.num_key_value_heads * hd
    out: dict[str, Shape] = {
        p + "q_proj.weight": (q_out, d),
        p + "k_proj.weight": (kv_out, d),
        p + "v_proj.weight": (kv_out, d),
        p + "o_proj.weight": (d, cfg.num_attention_heads * hd),
    }
    if cfg.attention_bias:
        out.update({p + "q_proj.bias": (q_out,), p + "k_proj.bias": (kv_out,)})
        out.update({p + "v_proj.bias": (kv_out,), p + "o_proj.bias": (d,)})
    if cfg.qk_norm:
        out.update({p + "q_norm.weight": (hd,), p + "k_norm.weight": (hd,)})
    return out


def _mlp_shapes(d: int, i: int, p: str) -> dict[str, Shape]:
    return {p + "gate_proj.weight": (i, d), p + "up_proj.weight": (i, d), p + "down_proj.weight": (d, i)}


def _moe_shapes(cfg: HybridConfig, p: str) -> dict[str, Shape]:
    d, e, i = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
    out: dict[str, Shape] = {
        p + "gate.weight": (e, d),
        p + "experts.gate_up_proj": (e, 2 * i, d),
        p + "experts.down_proj": (e, d, i),
    }
    if cfg.shared_expert_intermediate_size:
        out.update(_mlp_shapes(d, cfg.shared_expert_intermediate_size, p + "shared_expert."))
        out[p + "shared_expert_gate.weight"] = (1, d)
    return out


def validate_state_dict(cfg: HybridConfig, tensors: dict[str, torch.Tensor], *, where: str = "") -> list[str]:
    """Check that every expected tensor is present with the expected shape.

    Raises ``WeightsError`` listing missing names and shape mismatches; returns the names of
    unexpected (extra) tensors, which callers may ignore.
    """
    exp = expected_shapes(cfg)
    missing = [n for n in exp if n not in tensors]
    bad = [
        f"{n}: {tuple(tensors[n].shape)} != {exp[n]}" for n in exp if n in tensors and tuple(tensors[n].shape) != exp[n]
    ]
    src = f" in {where}" if where else ""
    if missing:
        raise WeightsError(
            f"{len(missing)} tensor(s) missing{src}, e.g. {missing[:5]}. The weights do not match "
            f"config.json ({cfg.model_type}, {cfg.num_layers} layers): use the config.json that came "
            "with these weights, or re-download the incomplete checkpoint."
        )
    if bad:
        raise WeightsError(
            f"{len(bad)} tensor shape(s) do not match config.json{src}, e.g. {bad[:3]}. "
            "Check that config.json belongs to these weights."
        )
    return [n for n in tensors if n not in exp]


# ---------------------------------------------------------------------------- HF folders
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


def load_checkpoint(
    folder: str | Path,
    *,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    settings: Settings | None = None,
) -> tuple[HybridConfig, dict[str, Any], dict[str, torch.Tensor]]:
    """Load a local HF folder: ``(HybridConfig, raw config.json dict, tensors by contract name)``.

    Shards are opened lazily with ``safe_open``; tensors we do not run (vision tower, MTP head)
    are never read. ``dtype`` casts floating tensors; ``device`` is where they are materialized.
    A folder with ``SHA256SUMS`` (the package's shipped weights) is checked against it first;
    ``settings`` says where a delta folder's base weights are (``Settings()`` when None).
    """
    from safetensors import SafetensorError, safe_open

    folder = Path(folder).expanduser()
    raw_cfg = read_hf_config(folder)
    from hypic_agent.runtime.models.checksums import CHECKSUMS, verify_checksums

    if (folder / CHECKSUMS).is_file():
        verify_checksums(folder)
    if "hypic_delta" in raw_cfg:  # a distilled model: base weights + stored tensors (training/delta.py)
        from hypic_agent.training.delta import load_delta

        return load_delta(folder, raw_cfg, dtype=dtype, device=device, settings=settings)
    cfg = HybridConfig.from_hf(raw_cfg)
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
    from hypic_agent.runtime.models.fingerprint import model_fingerprint

    if source.kind == "tiny":
        from hypic_agent.runtime.models.testing.tiny import random_state_dict, tiny_config

        raw = tiny_config(source.arch or "qwen3_5_text")
        dt = dtype or torch.float32
        cfg = HybridConfig.from_hf(raw)
        tensors = to_contract(cfg, {k: v.to(device) for k, v in random_state_dict(raw, seed, dt).items()})
        fp = model_fingerprint(cfg, dtype=dt, seed=seed)
        return LoadedWeights(source, cfg, raw, tensors, fp)
    assert source.path is not None
    if source.kind == "gguf":
        from hypic_agent.runtime.models.gguf_loader import load_gguf

        cfg, raw, tensors = load_gguf(source.path, dtype=dtype, device=device)
        files = [source.path]
    else:
        cfg, raw, tensors = load_checkpoint(source.path, dtype=dtype, device=device, settings=settings)
        files = weight_files(source.path)
    dt = dtype or tensors["model.embed_tokens.weight"].dtype
    fp = model_fingerprint(cfg, files, dtype=dt, cache_dir=fingerprint_cache)
    return LoadedWeights(source, cfg, raw, tensors, fp)
