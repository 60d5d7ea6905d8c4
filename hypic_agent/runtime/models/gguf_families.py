"""Per-architecture GGUF conventions: metadata -> HF config dict, our tensor names -> GGUF names.

Each ``GGUFFamily`` inverts what llama.cpp's ``convert_hf_to_gguf.py`` does for one architecture:

* ``llama`` and ``lfm2``: the metadata table is transformers' (``GGUF_CONFIG_MAPPING``) plus the
  fix-ups transformers' own GGUF loader applies (LFM2: the per-layer ``attention.head_count_kv``
  array marks attention layers, ``feed_forward_length`` is the already adjusted width); tensor
  values go through transformers' tensor processors (llama's Q/K row permutation undone, LFM2's
  squeezed short-conv kernel ``[D, L]`` unsqueezed).
* ``granitehybrid`` (Granite 4, our ``granitemoehybrid``) and ``nemotron_h``: no transformers
  table, so the metadata mapping is ours (``ssm.*`` keys, per-layer ``head_count_kv`` /
  ``feed_forward_length`` arrays telling attention, SSM and MLP blocks apart, the Granite scales);
  the SSM tensors are stored as the converter writes them (``A = -exp(A_log)`` as ``[H, 1]``,
  ``D`` as ``[H, 1]``, ``dt_bias`` as ``ssm_dt.bias``, the conv kernel squeezed to ``[C, W]``, the
  gated norm as ``[G, inner / G]``) and attention Q/K rows llama-permuted (``undo_permute``).

Tensor names: our contract name -> the checkpoint ("hub") name the converter reads -> gguf-py's
``TensorNameMap`` for the architecture; the few tensors the converter splits (Granite's fused expert
``input_linear``) are named through gguf-py's ``TENSOR_NAMES`` directly.
"""

from __future__ import annotations

import re
from typing import Any

from hypic_agent.errors import ModelConfigError
from hypic_agent.runtime.models.config import HybridConfig
from hypic_agent.runtime.models.loading.gguf_meta import GGUFMeta, common_config, mamba2_dims, per_layer, rms_eps


# ---------------------------------------------------------------------------- metadata -> HF config
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


# ---------------------------------------------------------------------------- contract -> hub names
_LAYER = re.compile(r"^model\.layers\.(\d+)\.([a-z_]+)\.(.+)$")


def lfm2_hub(cfg: HybridConfig, name: str) -> str:
    if name == "model.norm.weight":  # LFM2's final norm is called embedding_norm (-> token_embd_norm)
        return "model.embedding_norm.weight"
    return name.replace(".linear_attn.", ".conv.")


def mamba_leaf(leaf: str) -> str:
    """The converter renames ``dt_bias`` to ``dt_proj.bias`` (-> ``ssm_dt.bias``)."""
    return "dt_proj.bias" if leaf == "dt_bias" else leaf


_GRANITE_FUSED = re.compile(
    r"^model\.layers\.(\d+)\.mlp\.(experts\.gate_up_proj|experts\.down_proj|shared_expert\.(?:gate|up|down)_proj)"
)
_GRANITE_MLP = {"gate.weight": "block_sparse_moe.router.layer.weight"}


def granite_hub(cfg: HybridConfig, name: str) -> str:
    m = _LAYER.match(name)
    if m is None:
        return name
    pre, block, leaf = f"model.layers.{m[1]}.", m[2], m[3]
    if block == "linear_attn":
        return pre + "mamba." + mamba_leaf(leaf)
    if block == "mlp" and leaf in _GRANITE_MLP:
        return pre + _GRANITE_MLP[leaf]
    return name


def nemotron_hub(cfg: HybridConfig, name: str) -> str:
    top = {
        "model.embed_tokens.weight": "backbone.embeddings.weight",
        "model.norm.weight": "backbone.norm_f.weight",
    }
    if name in top:
        return top[name]
    m = _LAYER.match(name)
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
