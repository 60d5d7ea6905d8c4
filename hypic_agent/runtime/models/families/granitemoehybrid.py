"""IBM Granite 4 (``granitemoehybrid``): Mamba2 layers (``mamba``) plus attention without RoPE
(``position_embedding_type`` None) scaled by ``attention_multiplier``; a routed MoE (softmax over the
top-k logits) plus an ungated shared MLP, or the shared MLP alone with 0 experts; the embedding /
residual / logits multipliers.

Checkpoint names: ``mamba`` -> ``linear_attn``, ``block_sparse_moe`` router and experts (or the older
GraniteMoe ``input_linear`` / ``output_linear``) -> ``mlp.gate`` / ``mlp.experts``, ``shared_mlp`` (fused
gate and up) split into ``mlp.shared_expert`` (``mlp`` without experts).

GGUF ``granitehybrid``: no transformers table, so the metadata mapping is ours (``ssm.*`` keys,
per-layer ``head_count_kv`` / ``feed_forward_length`` arrays telling attention and SSM blocks apart,
the Granite scales); the SSM tensors are stored as the converter writes them (``A = -exp(A_log)`` as
``[H, 1]``, ``D`` as ``[H, 1]``, ``dt_bias`` as ``ssm_dt.bias``, the conv kernel squeezed to ``[C, W]``,
the gated norm as ``[G, inner / G]``) and attention Q/K rows llama-permuted (undone, ``permute_qk``);
the converter splits the fused expert ``input_linear`` into gate and up, named through gguf-py's
``TENSOR_NAMES`` directly (``granite_fused``).
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from hypic_agent.errors import ModelConfigError
from hypic_agent.runtime.models.config import HybridConfig
from hypic_agent.runtime.models.families.common import (
    LAYER,
    LAYER_PREFIX,
    Family,
    Tensors,
    gqa_heads,
    hybrid_config,
    json_float,
    layer_kinds,
    mamba_leaf,
    rename,
    rope_of,
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
def granite_moe_hybrid(raw: dict[str, Any], model_type: str) -> HybridConfig:
    n = int(raw["num_hidden_layers"])
    types = raw.get("layer_types") or raw.get("layers_block_type") or ["mamba"] * n
    if len(types) != n:
        raise ModelConfigError(f"layer_types has {len(types)} entries for {n} layers")
    hidden = int(raw["hidden_size"])
    heads = gqa_heads(raw, kv_default=True)
    rope = raw.get("position_embedding_type") == "rope"
    m_heads = int(raw.get("mamba_n_heads", 128))
    inner = int(raw.get("mamba_expand", 2)) * hidden
    d_head = raw.get("mamba_d_head", "auto")
    d_head = inner // m_heads if d_head in (None, "auto") else int(d_head)
    if d_head * m_heads != inner:
        raise ModelConfigError(f"mamba_d_head {d_head} x mamba_n_heads {m_heads} != mamba_expand x hidden {inner}")
    experts = int(raw.get("num_local_experts", 0) or 0)
    limit = raw.get("time_step_limit") or (0.0, float("inf"))
    kinds = layer_kinds(list(types), ("mamba", "linear_attention"), ("attention", "full_attention"))
    base = hybrid_config(
        raw, model_type, "granitemoehybrid", kinds, heads=heads, rope=rope_of(raw, heads[2]) if rope else (10000.0, 0),
        eps=1e-6, max_positions=2048,
    )  # fmt: skip
    return replace(
        base,
        attention_scale=float(raw.get("attention_multiplier", 1.0)),
        linear_kind="mamba2",
        linear_num_key_heads=int(raw.get("mamba_n_groups", 1)),
        linear_num_value_heads=m_heads,
        linear_key_head_dim=int(raw.get("mamba_d_state", 256)),
        linear_value_head_dim=d_head,
        linear_conv_kernel_dim=int(raw.get("mamba_d_conv", 4)),
        linear_conv_bias=bool(raw.get("mamba_conv_bias", True)),
        linear_proj_bias=bool(raw.get("mamba_proj_bias", False)),
        linear_out_bias=bool(raw.get("mamba_proj_bias", False)),
        linear_dt_limit=(json_float(limit[0]), json_float(limit[1])),
        intermediate_size=int(raw.get("shared_intermediate_size", 1024)),
        num_experts=experts,
        num_experts_per_tok=int(raw.get("num_experts_per_tok", 2) or 0),
        moe_intermediate_size=int(raw.get("intermediate_size", 0) or 0),
        shared_expert_intermediate_size=int(raw.get("shared_intermediate_size", 1024)),
        norm_topk_prob=True,  # softmax over the top-k logits == softmax, top-k, renormalize
        shared_expert_gate=False,
        moe_layers=tuple(experts > 0 for _ in range(n)),
        embedding_multiplier=float(raw.get("embedding_multiplier", 1.0)),
        residual_multiplier=float(raw.get("residual_multiplier", 1.0)),
        logits_scaling=float(raw.get("logits_scaling", 1.0)),
    )


# ---------------------------------------------------------------------------- checkpoint names
_NAMES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(LAYER_PREFIX + r"mamba\."), r"\1linear_attn."),
    (re.compile(LAYER_PREFIX + r"block_sparse_moe\.router\.(layer\.)?weight$"), r"\1mlp.gate.weight"),
    (re.compile(LAYER_PREFIX + r"block_sparse_moe\.experts\."), r"\1mlp.experts."),
    # the older GraniteMoe layout of the same expert tensors ([E, 2I, D] / [E, D, I])
    (re.compile(LAYER_PREFIX + r"block_sparse_moe\.input_linear\.weight$"), r"\1mlp.experts.gate_up_proj"),
    (re.compile(LAYER_PREFIX + r"block_sparse_moe\.output_linear\.weight$"), r"\1mlp.experts.down_proj"),
]
_SHARED = re.compile(LAYER_PREFIX + r"shared_mlp\.(input|output)_linear\.weight$")


def granite_names(cfg: HybridConfig, tensors: Tensors) -> Tensors:
    out: Tensors = {}
    for k, v in tensors.items():
        m = _SHARED.match(k)
        if m is None:
            out[rename(k, _NAMES)] = v
            continue
        pre = m[1] + ("mlp.shared_expert." if cfg.num_experts else "mlp.")
        if m[2] == "input":  # [2I, D] = cat(gate, up)
            gate, up = v.chunk(2, dim=0)
            out[pre + "gate_proj.weight"], out[pre + "up_proj.weight"] = gate, up
        else:
            out[pre + "down_proj.weight"] = v
    return out


# ---------------------------------------------------------------------------- GGUF
def granite_config(meta: GGUFMeta) -> dict[str, Any]:
    """``granitehybrid`` metadata -> a ``granitemoehybrid`` config.json dict."""
    n = int(meta.require("block_count"))
    heads = int(meta.require("attention.head_count"))
    kv = per_layer(meta.get("attention.head_count_kv", 0), n)
    hidden = int(meta.require("embedding_length"))
    m_heads, _, groups, state, kernel = mamba2_dims(meta)
    inner = int(meta.require("ssm.inner_size"))
    if inner % hidden:
        raise ModelConfigError(f"GGUF ssm.inner_size {inner} is not a multiple of embedding_length {hidden}")
    experts = int(meta.get("expert_count", 0) or 0)
    shared = meta.get("expert_shared_feed_forward_length")
    if shared is None:  # dense: the shared MLP is the layer's MLP (ffn_gate rows)
        gate = next((s for k, s in meta.shapes.items() if k.endswith("ffn_gate.weight")), None)
        shared = gate[0] if gate else meta.get("feed_forward_length", 0)
    if meta.get("rope.scaling.finetuned", False):  # the converter's mark of RoPE attention: Bamba
        raise ModelConfigError(
            "granitehybrid GGUF with RoPE attention (a converted Bamba model) is not supported; "
            "Granite 4 (granitemoehybrid) attention has no RoPE",
            param="model",
        )
    attn = [i for i in range(n) if kv[i] > 0]
    cfg: dict[str, Any] = {
        "model_type": "granitemoehybrid",
        **common_config(meta),
        "num_hidden_layers": n,
        "layer_types": ["attention" if kv[i] > 0 else "mamba" for i in range(n)],
        "num_attention_heads": heads,
        "num_key_value_heads": max(kv) if attn else heads,
        "head_dim": int(meta.get("attention.key_length", hidden // heads)),
        "max_position_embeddings": int(meta.get("context_length", 2048)),
        "rms_norm_eps": rms_eps(meta),
        "attention_bias": any(k.endswith("attn_q.bias") for k in meta.shapes),
        "position_embedding_type": None,
        "mamba_n_heads": m_heads,
        "mamba_n_groups": groups,
        "mamba_d_state": state,
        "mamba_d_conv": kernel,
        "mamba_expand": inner // hidden,
        "mamba_conv_bias": any(k.endswith("ssm_conv1d.bias") for k in meta.shapes),
        "mamba_proj_bias": any(k.endswith("ssm_in.bias") for k in meta.shapes),
        "num_local_experts": experts,
        "num_experts_per_tok": int(meta.get("expert_used_count", 0) or 0),
        "intermediate_size": int(meta.get("feed_forward_length", 0) or 0),  # per expert
        "shared_intermediate_size": int(shared),
        "attention_multiplier": float(meta.get("attention.scale", 1.0)),
        "embedding_multiplier": float(meta.get("embedding_scale", 1.0)),
        "residual_multiplier": float(meta.get("residual_scale", 1.0)),
        "logits_scaling": float(meta.get("logit_scale", 1.0)),
    }
    return cfg


_GRANITE_FUSED = re.compile(
    r"^model\.layers\.(\d+)\.mlp\.(experts\.gate_up_proj|experts\.down_proj|shared_expert\.(?:gate|up|down)_proj)"
)
_GRANITE_MLP = {"gate.weight": "block_sparse_moe.router.layer.weight"}


def granite_hub(cfg: HybridConfig, name: str) -> str:
    m = LAYER.match(name)
    if m is None:
        return name
    pre, block, leaf = f"model.layers.{m[1]}.", m[2], m[3]
    if block == "linear_attn":
        return pre + "mamba." + mamba_leaf(leaf)
    if block == "mlp" and leaf in _GRANITE_MLP:
        return pre + _GRANITE_MLP[leaf]
    return name


def granite_fused(cfg: HybridConfig, name: str) -> tuple[str, ...] | None:
    """Granite MoE tensors named through gguf-py's ``TENSOR_NAMES`` (the converter splits the fused
    expert ``input_linear [E, 2I, D]`` into gate and up: concatenated back along dim 1)."""
    from gguf import MODEL_TENSOR, TENSOR_NAMES

    m = _GRANITE_FUSED.match(name)
    if m is None:
        return None
    kinds: tuple[MODEL_TENSOR, ...] = {
        "experts.gate_up_proj": (MODEL_TENSOR.FFN_GATE_EXP, MODEL_TENSOR.FFN_UP_EXP),
        "experts.down_proj": (MODEL_TENSOR.FFN_DOWN_EXP,),
        "shared_expert.gate_proj": (MODEL_TENSOR.FFN_GATE_SHEXP,),
        "shared_expert.up_proj": (MODEL_TENSOR.FFN_UP_SHEXP,),
        "shared_expert.down_proj": (MODEL_TENSOR.FFN_DOWN_SHEXP,),
    }[m[2]]
    return tuple(TENSOR_NAMES[k].format(bid=int(m[1])) + ".weight" for k in kinds)


GRANITE_HYBRID = GGUFFamily(
    "granitehybrid",
    "granitemoehybrid",
    "GRANITE_HYBRID",
    config=granite_config,
    hub=granite_hub,
    fused=granite_fused,
    permute_qk=True,
)

FAMILY = Family(
    name="granitemoehybrid",
    model_types=("granitemoehybrid",),
    normalize=granite_moe_hybrid,
    names=granite_names,
    gguf=(GRANITE_HYBRID,),
)
