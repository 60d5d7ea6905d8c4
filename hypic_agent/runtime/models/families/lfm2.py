"""LiquidAI LFM2 (``lfm2``): gated short-convolution layers (``conv``: ``short_conv``, no recurrent state)
plus GQA attention with per-head q/k RMSNorm; plain RMSNorm ``w * y``; a SwiGLU feed-forward whose width
follows transformers' ``block_auto_adjust_ff_dim`` rule.

Checkpoint names: transformers' ``Lfm2`` modules (``conv``, ``operator_norm``, ``ffn_norm``,
``feed_forward.w1/w2/w3``, ``self_attn.out_proj`` / ``q_layernorm`` / ``k_layernorm``, the final
``embedding_norm``) renamed to ours.

GGUF ``lfm2``: the metadata is transformers' table (``GGUF_CONFIG_MAPPING``) plus the fix-ups its own
GGUF loader applies (the per-layer ``attention.head_count_kv`` array marks attention layers,
``feed_forward_length`` is the already adjusted width); tensor values through transformers' tensor
processor (the squeezed short-conv kernel ``[D, L]`` unsqueezed).
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from hypic_agent.errors import ModelConfigError
from hypic_agent.runtime.models.config import HybridConfig
from hypic_agent.runtime.models.families.common import (
    LAYER_PREFIX,
    Family,
    Tensors,
    gqa_heads,
    hybrid_config,
    layer_kinds,
    rename,
    rope_of,
)
from hypic_agent.runtime.models.loading.gguf_meta import GGUFFamily, GGUFMeta, per_layer


# ---------------------------------------------------------------------------- config.json
def _lfm2_ff(raw: dict[str, Any]) -> int:
    """transformers' ``Lfm2MLP`` width: 2/3 of ``intermediate_size`` times the multiplier, rounded up
    to ``block_multiple_of`` (when ``block_auto_adjust_ff_dim``)."""
    size = int(raw["block_ff_dim"] if "block_ff_dim" in raw else raw["intermediate_size"])
    if raw.get("block_auto_adjust_ff_dim", True):
        size = int(2 * size / 3)
        mult = raw.get("block_ffn_dim_multiplier", 1.0)
        if mult is not None:
            size = int(mult * size)
            of = int(raw.get("block_multiple_of", 256))
            size = of * ((size + of - 1) // of)
    return size


def lfm2(raw: dict[str, Any], model_type: str) -> HybridConfig:
    n = int(raw["num_hidden_layers"])
    types = raw.get("layer_types")
    if types is None:
        full = set(raw.get("full_attn_idxs") or range(n))
        types = ["full_attention" if i in full else "conv" for i in range(n)]
    if len(types) != n:
        raise ModelConfigError(f"layer_types has {len(types)} entries for {n} layers")
    heads = gqa_heads(raw)
    raw = {"rope_theta": 1000000.0, **raw}  # transformers' Lfm2Config default
    kinds = layer_kinds(list(types), ("conv",), ("full_attention", "attention"))
    tie = bool(raw.get("tie_word_embeddings", raw.get("tie_embedding", True)))
    base = hybrid_config(
        raw, model_type, "lfm2", kinds, heads=heads, rope=rope_of(raw, heads[2]), eps=1e-5, eps_key="norm_eps",
        max_positions=128000, tie=tie, read_act=False,
    )  # fmt: skip
    bias = bool(raw.get("conv_bias", False))
    return replace(
        base,
        attention_bias=False,
        qk_norm=True,
        linear_kind="short_conv",
        linear_conv_kernel_dim=int(raw.get("conv_L_cache", 3)),
        linear_conv_bias=bias,
        linear_proj_bias=bias,
        linear_out_bias=bias,
        intermediate_size=_lfm2_ff(raw),
    )


# ---------------------------------------------------------------------------- checkpoint names
_NAMES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"^model\.embedding_norm\."), "model.norm."),
    (re.compile(LAYER_PREFIX + r"conv\."), r"\1linear_attn."),
    (re.compile(LAYER_PREFIX + r"self_attn\.out_proj\."), r"\1self_attn.o_proj."),
    (re.compile(LAYER_PREFIX + r"self_attn\.q_layernorm\."), r"\1self_attn.q_norm."),
    (re.compile(LAYER_PREFIX + r"self_attn\.k_layernorm\."), r"\1self_attn.k_norm."),
    (re.compile(LAYER_PREFIX + r"operator_norm\."), r"\1input_layernorm."),
    (re.compile(LAYER_PREFIX + r"ffn_norm\."), r"\1post_attention_layernorm."),
    (re.compile(LAYER_PREFIX + r"feed_forward\.w1\."), r"\1mlp.gate_proj."),
    (re.compile(LAYER_PREFIX + r"feed_forward\.w3\."), r"\1mlp.up_proj."),
    (re.compile(LAYER_PREFIX + r"feed_forward\.w2\."), r"\1mlp.down_proj."),
]


def lfm2_names(cfg: HybridConfig, tensors: Tensors) -> Tensors:
    return {rename(k, _NAMES): v for k, v in tensors.items()}


# ---------------------------------------------------------------------------- GGUF
def lfm2_config(meta: GGUFMeta, cfg: dict[str, Any]) -> dict[str, Any]:
    """transformers' table gave ``cfg``; apply its LFM2 fix-ups (and the head width, eps key)."""
    kv = per_layer(cfg.get("num_key_value_heads", 0), int(cfg["num_hidden_layers"]))
    cfg["num_key_value_heads"] = max(kv)
    cfg["layer_types"] = ["full_attention" if h > 0 else "conv" for h in kv]
    cfg["block_auto_adjust_ff_dim"] = False  # feed_forward_length is the width after the rule
    if "rms_norm_eps" in cfg:
        cfg["norm_eps"] = cfg.pop("rms_norm_eps")
    key_length = meta.get("attention.key_length")
    if key_length is not None:
        cfg["head_dim"] = int(key_length)
    cfg["conv_bias"] = any(n.endswith("shortconv.in_proj.bias") for n in meta.shapes)
    return cfg


def lfm2_hub(cfg: HybridConfig, name: str) -> str:
    if name == "model.norm.weight":  # LFM2's final norm is called embedding_norm (-> token_embd_norm)
        return "model.embedding_norm.weight"
    return name.replace(".linear_attn.", ".conv.")


FAMILY = Family(
    name="lfm2",
    model_types=("lfm2",),
    normalize=lfm2,
    names=lfm2_names,
    gguf=(GGUFFamily("lfm2", "lfm2", "LFM2", fixup=lfm2_config, hub=lfm2_hub),),
)
