"""NVIDIA Nemotron-H (``nemotron_h``): blocks of one norm + one mixer each (Mamba2, attention without
RoPE, squared-ReLU MLP); a mixer block and the MLP block after it become one of our layers, a mixer
block without one a layer without feed-forward (``ffn_layers``; ``hf_blocks`` keeps each layer's block
indices); MoE blocks are refused.

Checkpoint names: ``backbone.layers.{j}.norm`` / ``mixer`` of block j -> its layer's ``input_layernorm``
and ``linear_attn`` / ``self_attn`` (a mixer block) or ``post_attention_layernorm`` and ``mlp`` (the MLP
block after it); ``embeddings`` / ``norm_f`` -> ``embed_tokens`` / ``norm``.

GGUF ``nemotron_h``: metadata mapped by us (transformers has no table): the block pattern is read off
the per-block ``head_count_kv`` and ``feed_forward_length`` arrays; the SSM tensors as for Granite 4
(``granitemoehybrid.py``), attention Q/K rows llama-permuted (undone, ``permute_qk``).
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from hypic_agent.errors import ModelConfigError
from hypic_agent.runtime.models.config import HybridConfig, LayerKind
from hypic_agent.runtime.models.families.common import (
    LAYER,
    Family,
    Tensors,
    gqa_heads,
    hybrid_config,
    json_float,
    mamba_leaf,
)
from hypic_agent.runtime.models.loading.gguf_meta import (
    GGUFFamily,
    GGUFMeta,
    common_config,
    mamba2_dims,
    per_layer,
    rms_eps,
)

# ---------------------------------------------------------------------------- config.json
_NEMOTRON_BLOCKS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}


def _nemotron_layers(types: list[str]) -> tuple[tuple[LayerKind, ...], tuple[bool, ...], tuple[tuple[int, int], ...]]:
    """Nemotron-H blocks (each one norm + one of mamba / attention / mlp) -> our layers: a mixer block
    and the MLP block right after it (if any) form one layer. -> (kinds, has feed-forward, blocks)."""
    kinds: list[LayerKind] = []
    ffn: list[bool] = []
    blocks: list[tuple[int, int]] = []
    for j, t in enumerate(types):
        t = _NEMOTRON_BLOCKS.get(t, t)
        if t in ("mamba", "linear_attention"):
            kinds.append("linear")
        elif t in ("attention", "full_attention"):
            kinds.append("attention")
        elif t == "mlp":
            if not kinds or ffn[-1]:
                raise ModelConfigError(f"Nemotron-H block {j}: an MLP block must follow a mamba or attention block")
            ffn[-1], blocks[-1] = True, (blocks[-1][0], j)
            continue
        elif t == "moe":
            raise ModelConfigError("Nemotron-H MoE blocks ('E', Nemotron 3) are not supported yet")
        else:
            raise ModelConfigError(f"unknown Nemotron-H block type {t!r}")
        ffn.append(False)
        blocks.append((j, -1))
    return tuple(kinds), tuple(ffn), tuple(blocks)


def nemotron_h(raw: dict[str, Any], model_type: str) -> HybridConfig:
    """NVIDIA Nemotron-H: Mamba2 and attention (no RoPE) blocks, squared-ReLU MLP blocks."""
    types = raw.get("layers_block_type") or raw.get("layer_types")
    if types is None:
        types = list(str(raw["hybrid_override_pattern"]))
    kinds, ffn, blocks = _nemotron_layers(list(types))
    if raw.get("mlp_bias"):
        raise ModelConfigError("Nemotron-H with mlp_bias is not supported yet")
    # rope left at none: the attention blocks have no positional encoding
    base = hybrid_config(
        raw, model_type, "nemotron_h", kinds, heads=gqa_heads(raw, kv_default=True), eps=1e-5,
        eps_key="layer_norm_epsilon", max_positions=4096, read_act=False,
    )  # fmt: skip
    return replace(
        base,
        linear_kind="mamba2",
        linear_num_key_heads=int(raw.get("n_groups", 8)),
        linear_num_value_heads=int(raw.get("mamba_num_heads", 128)),
        linear_key_head_dim=int(raw.get("ssm_state_size", 128)),
        linear_value_head_dim=int(raw.get("mamba_head_dim", 64)),
        linear_conv_kernel_dim=int(raw.get("conv_kernel", 4)),
        linear_conv_bias=bool(raw.get("use_conv_bias", True)),
        linear_proj_bias=bool(raw.get("mamba_proj_bias", False)),
        linear_out_bias=bool(raw.get("use_bias", False)),
        linear_dt_limit=(json_float(raw.get("time_step_min", 0.001)), float("inf")),  # as transformers clamps
        ffn_act="relu2",
        ffn_layers=ffn,
        hf_blocks=blocks,
        intermediate_size=int(raw.get("intermediate_size", 0)),
    )


# ---------------------------------------------------------------------------- checkpoint names
_NEMOTRON_BLOCK = re.compile(r"^(?:model|backbone)\.layers\.(\d+)\.(norm|mixer)\.(.+)$")
_NEMOTRON_TOP = {
    "model.embeddings.weight": "model.embed_tokens.weight",
    "backbone.embeddings.weight": "model.embed_tokens.weight",
    "model.norm_f.weight": "model.norm.weight",
    "backbone.norm_f.weight": "model.norm.weight",
}


def nemotron_names(cfg: HybridConfig, tensors: Tensors) -> Tensors:
    """Block j's ``norm`` / ``mixer`` -> its layer's ``input_layernorm`` and ``linear_attn`` / ``self_attn``
    (a mixer block) or ``post_attention_layernorm`` and ``mlp`` (the MLP block after it)."""
    role: dict[int, tuple[int, str, str]] = {}
    for i, (mixer_block, ffn_block) in enumerate(cfg.hf_blocks):
        role[mixer_block] = (i, "input_layernorm", "linear_attn" if cfg.layer_types[i] == "linear" else "self_attn")
        if ffn_block >= 0:
            role[ffn_block] = (i, "post_attention_layernorm", "mlp")
    out: Tensors = {}
    for k, v in tensors.items():
        m = _NEMOTRON_BLOCK.match(k)
        if m is None or int(m[1]) not in role:
            out[_NEMOTRON_TOP.get(k, k)] = v
            continue
        layer, norm, mixer = role[int(m[1])]
        out[f"model.layers.{layer}.{norm if m[2] == 'norm' else mixer}.{m[3]}"] = v
    return out


# ---------------------------------------------------------------------------- GGUF
def nemotron_config(meta: GGUFMeta) -> dict[str, Any]:
    """``nemotron_h`` metadata -> a config.json dict; the block pattern (``M`` Mamba2, ``*`` attention,
    ``-`` MLP) is read off the per-block ``head_count_kv`` and ``feed_forward_length`` arrays, as
    llama.cpp does (a block with neither is recurrent)."""
    n = int(meta.require("block_count"))
    kv = per_layer(meta.get("attention.head_count_kv", 0), n)
    ff = per_layer(meta.get("feed_forward_length", 0), n)
    heads = max(per_layer(meta.require("attention.head_count"), n))
    hidden = int(meta.require("embedding_length"))
    m_heads, m_head_dim, groups, state, kernel = mamba2_dims(meta)
    pattern = "".join("*" if kv[j] > 0 else "-" if ff[j] > 0 else "M" for j in range(n))
    return {
        "model_type": "nemotron_h",
        **common_config(meta),
        "num_hidden_layers": n,
        "hybrid_override_pattern": pattern,
        "num_attention_heads": heads,
        "num_key_value_heads": max(kv) if max(kv) > 0 else heads,
        "head_dim": int(meta.get("attention.key_length", hidden // heads)),
        "max_position_embeddings": int(meta.get("context_length", 4096)),
        "layer_norm_epsilon": rms_eps(meta),
        "attention_bias": any(k.endswith("attn_q.bias") for k in meta.shapes),
        "mlp_bias": any(k.endswith("ffn_up.bias") for k in meta.shapes),
        "mamba_num_heads": m_heads,
        "mamba_head_dim": m_head_dim,
        "n_groups": groups,
        "ssm_state_size": state,
        "conv_kernel": kernel,
        "use_conv_bias": any(k.endswith("ssm_conv1d.bias") for k in meta.shapes),
        "mamba_proj_bias": any(k.endswith("ssm_in.bias") for k in meta.shapes),
        "use_bias": any(k.endswith("ssm_out.bias") for k in meta.shapes),
        "intermediate_size": max(ff),
    }


def nemotron_hub(cfg: HybridConfig, name: str) -> str:
    top = {
        "model.embed_tokens.weight": "backbone.embeddings.weight",
        "model.norm.weight": "backbone.norm_f.weight",
    }
    if name in top:
        return top[name]
    m = LAYER.match(name)
    if m is None:
        return name
    mixer_block, ffn_block = cfg.hf_blocks[int(m[1])]
    block, leaf = m[2], m[3]
    if block in ("mlp", "post_attention_layernorm"):
        j = ffn_block
        leaf = "norm." + leaf if block == "post_attention_layernorm" else "mixer." + leaf
    else:
        j = mixer_block
        leaf = "norm." + leaf if block == "input_layernorm" else "mixer." + mamba_leaf(leaf)
    return f"backbone.layers.{j}.{leaf}"


FAMILY = Family(
    name="nemotron_h",
    model_types=("nemotron_h",),
    normalize=nemotron_h,
    names=nemotron_names,
    gguf=(
        GGUFFamily("nemotron_h", "nemotron_h", "NEMOTRON_H", config=nemotron_config, hub=nemotron_hub, permute_qk=True),
    ),
)
