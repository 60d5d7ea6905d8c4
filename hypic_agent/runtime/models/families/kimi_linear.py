"""Kimi Linear (``kimi_linear``): Kimi Delta Attention layers (``kda``: a delta rule with a per-key-channel
decay) and MLA with NoPE (``layers/mla.py``), DeepSeek-style MoE (sigmoid router, grouped top-k, shared
experts).

config.json: checkpoints keep the linear layers' shape in ``linear_attn_config`` (``num_heads``,
``head_dim``, ``short_conv_kernel_size``, 1-indexed ``kda_layers`` / ``full_attn_layers``); transformers'
config class reads the same fields at the top level too. Dense MLP layers: ``mlp_layer_types`` or the
first ``first_k_dense_replace`` layers.

Checkpoint names: the KDA layers' ``self_attn.*`` -> ``linear_attn.*``, hub checkpoints' forget-gate
tensors under ``forget_gate`` and their ``q/k/v_conv1d`` stacked into ``conv1d``, ``mlp.shared_experts``
-> ``mlp.shared_expert``, the Mixtral-style hub experts (``common.mixtral_expert_name``).

GGUF ``kimi-linear``: what llama.cpp's converter (``KimiLinearModel``) does, and how we read it back:


* metadata: the per-layer ``attention.head_count_kv`` array marks the MLA layers (1 there: MLA is
  written as MQA over the latent; 0 for KDA layers); ``ssm.conv_kernel``, ``kda.head_dim``; MLA as
  ``attention.q_lora_rank`` (absent: no Q compression), ``attention.kv_lora_rank``,
  ``rope.dimension_count`` (the decoupled key part), ``attention.key_length_mla`` (nope + rope) and
  ``attention.value_length_mla``; MoE as ``expert_*`` keys, ``leading_dense_block_count`` (dense first
  layers) and ``expert_weights_scale`` (the routed scaling factor). The KDA head count is not stored:
  llama.cpp takes ``attention.head_count``, and so do we.
* values: the q / k / v short-conv kernels as three ``[1, C, 1, W]`` tensors (stacked back into our
  ``conv1d``), ``A = -exp(A_log)`` kept ``[1, 1, H, 1]``, ``dt_bias`` as ``ssm_dt.bias``; MLA's
  ``kv_b_proj`` split per head into ``attn_k_b`` (transposed: ``[H, rank, nope]``) and ``attn_v_b``
  (``[H, v, rank]``) for the absorbed form: put back as ``[H * (nope + v), rank]`` (``join``); experts
  stacked as ``ffn_{gate,up,down}_exps``.
* the router: sigmoid scores plus the ``exp_probs_b`` correction bias, as our Kimi MoE; top-k weights
  renormalised unless ``expert_weights_norm`` says false; ``expert_gating_func`` other than sigmoid
  is refused.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from hypic_agent.errors import ModelConfigError
from hypic_agent.runtime.models.config import HybridConfig, LayerKind, MLAShape
from hypic_agent.runtime.models.families.common import LAYER, Family, Tensors, hybrid_config, mixtral_expert_name
from hypic_agent.runtime.models.loading.gguf_meta import GGUFFamily, GGUFMeta, common_config, per_layer


# ---------------------------------------------------------------------------- config.json
def _layer_types(raw: dict[str, Any], n: int, lin: dict[str, Any]) -> tuple[LayerKind, ...]:
    types = raw.get("layer_types")
    if types is None and "kda_layers" in lin and "full_attn_layers" in lin:
        full = {int(i) - 1 for i in lin["full_attn_layers"]}
        types = ["full_attention" if i in full else "linear_attention" for i in range(n)]
    if types is None:
        raise ModelConfigError("kimi_linear config.json names neither layer_types nor linear_attn_config layers")
    out: list[LayerKind] = []
    for t in types:
        if t not in ("linear_attention", "full_attention"):
            raise ModelConfigError(f"unknown layer type {t!r} in layer_types")
        out.append("linear" if t == "linear_attention" else "attention")
    if len(out) != n:
        raise ModelConfigError(f"layer_types has {len(out)} entries for {n} layers")
    return tuple(out)


# hub config.json names -> transformers' KimiLinearConfig names
_ALIASES = {
    "model_max_length": "max_position_embeddings",
    "num_experts_per_token": "num_experts_per_tok",
    "num_expert_group": "n_group",
    "num_shared_experts": "n_shared_experts",
    "moe_renormalize": "norm_topk_prob",
    "num_experts": "num_local_experts",
}


def kimi_linear(raw: dict[str, Any], model_type: str) -> HybridConfig:
    raw = {**{_ALIASES[k]: v for k, v in raw.items() if k in _ALIASES}, **raw}
    n = int(raw["num_hidden_layers"])
    lin = dict(raw.get("linear_attn_config") or {})
    heads = int(lin.get("num_heads", raw.get("linear_num_heads", 32)))
    head_dim = int(lin.get("head_dim", raw.get("linear_head_dim", 128)))
    mlp_types = raw.get("mlp_layer_types")
    if mlp_types is None:
        k_dense = int(raw.get("first_k_dense_replace", 1))
        mlp_types = ["dense" if i < k_dense else "sparse" for i in range(n)]
    mla = MLAShape(
        q_lora_rank=int(raw.get("q_lora_rank") or 0),
        kv_lora_rank=int(raw.get("kv_lora_rank", 512)),
        qk_nope_head_dim=int(raw.get("qk_nope_head_dim", 128)),
        qk_rope_head_dim=int(raw.get("qk_rope_head_dim", 64)),
        v_head_dim=int(raw.get("v_head_dim") or 128),
    )
    qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    if mla.v_head_dim > qk:
        raise ModelConfigError(f"MLA v_head_dim {mla.v_head_dim} above the key width {qk} is not supported")
    attn_heads = int(raw.get("num_attention_heads", 32))
    # per-head keys and values after the latent expansion; NoPE (no rotated dims)
    base = hybrid_config(
        raw, model_type, "kimi_linear", _layer_types(raw, n, lin), heads=(attn_heads, attn_heads, qk), eps=1e-5,
        max_positions=1048576,
    )  # fmt: skip
    return replace(
        base,
        mla=mla,
        linear_kind="kda",
        linear_num_key_heads=heads,
        linear_num_value_heads=heads,
        linear_key_head_dim=head_dim,
        linear_value_head_dim=head_dim,
        linear_conv_kernel_dim=int(lin.get("short_conv_kernel_size", raw.get("linear_conv_kernel_dim", 4))),
        intermediate_size=int(raw.get("intermediate_size", 0)),
        num_experts=int(raw.get("num_local_experts", 256)),
        num_experts_per_tok=int(raw.get("num_experts_per_tok") or 8),
        moe_intermediate_size=int(raw.get("moe_intermediate_size", 1024)),
        shared_expert_intermediate_size=int(raw.get("moe_intermediate_size", 1024))
        * int(raw.get("n_shared_experts", 1)),
        shared_expert_gate=False,
        norm_topk_prob=bool(raw.get("norm_topk_prob", True)),
        router="sigmoid",
        routed_scaling_factor=float(raw.get("routed_scaling_factor", 1.0)),
        router_groups=(int(raw.get("n_group", 1)), int(raw.get("topk_group") or 1)),
        moe_layers=tuple(t == "sparse" for t in mlp_types),
    )


# ---------------------------------------------------------------------------- checkpoint names
_SELF_ATTN = re.compile(r"^model\.layers\.(\d+)\.self_attn\.(.+)$")
_KIMI_GATE = re.compile(r"\.linear_attn\.(f_a_proj\.|f_b_proj\.|f_proj\.|dt_bias$|A_log$)")
_KIMI_CONV = re.compile(r"^(model\.layers\.\d+\.linear_attn\.)([qkv])_conv1d\.weight$")


def kimi_names(cfg: HybridConfig, tensors: Tensors) -> Tensors:
    """KDA layers' ``self_attn.*`` -> ``linear_attn.*``; hub checkpoints' forget-gate tensors moved under
    ``forget_gate`` and their ``q/k/v_conv1d`` stacked into ``conv1d``; ``mlp.shared_experts`` ->
    ``mlp.shared_expert``."""
    out: Tensors = {}
    convs: dict[str, Tensors] = {}
    for k, v in tensors.items():
        m = _SELF_ATTN.match(k)
        if m is not None and cfg.layer_types[int(m[1])] == "linear":
            k = _KIMI_GATE.sub(r".linear_attn.forget_gate.\1", f"model.layers.{m[1]}.linear_attn.{m[2]}")
        c = _KIMI_CONV.match(k)
        if c is not None:
            convs.setdefault(c[1], {})[c[2]] = v
            continue
        out[k.replace(".mlp.shared_experts.", ".mlp.shared_expert.")] = v
    for pre, parts in convs.items():
        out[pre + "conv1d.weight"] = torch.cat([parts["q"], parts["k"], parts["v"]])
    return out


# ---------------------------------------------------------------------------- GGUF
_SIGMOID = 2  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID
_FUSED = re.compile(
    r"^model\.layers\.(\d+)\.(linear_attn\.conv1d\.weight|self_attn\.kv_b_proj\.weight|mlp\.experts\.gate_up_proj"
    r"|mlp\.experts\.down_proj)$"
)
_HUB_MLP = {  # our MoE names -> the hub checkpoint's block_sparse_moe names
    "gate.weight": "block_sparse_moe.gate.weight",
    "gate.e_score_correction_bias": "block_sparse_moe.gate.e_score_correction.bias",
}


def kimi_config(meta: GGUFMeta) -> dict[str, Any]:
    """``kimi-linear`` metadata -> a config.json dict (transformers' ``KimiLinearConfig`` names)."""
    n = int(meta.require("block_count"))
    kv = per_layer(meta.require("attention.head_count_kv"), n)
    gating = meta.get("expert_gating_func")
    if gating is not None and int(gating) != _SIGMOID:
        raise ModelConfigError(
            f"GGUF kimi-linear with expert_gating_func {gating} is not supported (Kimi Linear routes by sigmoid)",
            param="model",
        )
    rope = int(meta.require("rope.dimension_count"))
    q_lora = meta.get("attention.q_lora_rank")
    return {
        "model_type": "kimi_linear",
        **common_config(meta),
        "num_hidden_layers": n,
        "num_attention_heads": int(meta.require("attention.head_count")),
        "max_position_embeddings": int(meta.get("context_length", 1048576)),
        "rms_norm_eps": float(meta.get("attention.layer_norm_rms_epsilon", 1e-5)),
        "linear_attn_config": {
            "num_heads": int(meta.require("attention.head_count")),
            "head_dim": int(meta.require("kda.head_dim")),
            "short_conv_kernel_size": int(meta.require("ssm.conv_kernel")),
            "kda_layers": [i + 1 for i in range(n) if kv[i] == 0],
            "full_attn_layers": [i + 1 for i in range(n) if kv[i] > 0],
        },
        "q_lora_rank": int(q_lora) if q_lora else None,
        "kv_lora_rank": int(meta.require("attention.kv_lora_rank")),
        "qk_rope_head_dim": rope,
        "qk_nope_head_dim": int(meta.require("attention.key_length_mla")) - rope,
        "v_head_dim": int(meta.require("attention.value_length_mla")),
        "intermediate_size": int(meta.get("feed_forward_length", 0) or 0),
        "num_local_experts": int(meta.require("expert_count")),
        "num_experts_per_tok": int(meta.require("expert_used_count")),
        "moe_intermediate_size": int(meta.require("expert_feed_forward_length")),
        "n_shared_experts": int(meta.get("expert_shared_count", 1)),
        "first_k_dense_replace": int(meta.get("leading_dense_block_count", 1)),
        "routed_scaling_factor": float(meta.get("expert_weights_scale", 1.0)),
        "norm_topk_prob": bool(meta.get("expert_weights_norm", True)),
        "n_group": int(meta.get("expert_group_count", 1) or 1),
        "topk_group": int(meta.get("expert_group_used_count", 1) or 1),
    }


def kimi_hub(cfg: HybridConfig, name: str) -> str:
    """Our name -> the hub checkpoint's (``self_attn.*`` for both layer kinds, the forget gate's
    tensors directly under it, ``block_sparse_moe``), as the converter reads it."""
    m = LAYER.match(name)
    if m is None:
        return name
    pre, block, leaf = f"model.layers.{m[1]}.", m[2], m[3]
    if block == "linear_attn":
        leaf = leaf.removeprefix("forget_gate.")
        return pre + "self_attn." + ("dt_proj.bias" if leaf == "dt_bias" else leaf)
    if block == "mlp" and leaf in _HUB_MLP:
        return pre + _HUB_MLP[leaf]
    if block == "mlp" and leaf.startswith("shared_expert."):
        return pre + "block_sparse_moe.shared_experts." + leaf.removeprefix("shared_expert.")
    return name


def kimi_fused(cfg: HybridConfig, name: str) -> tuple[str, ...] | None:
    """Tensors the converter splits: the q/k/v convs, MLA's ``kv_b_proj``, the stacked experts."""
    from gguf import MODEL_TENSOR, TENSOR_NAMES

    m = _FUSED.match(name)
    if m is None:
        return None
    kinds: tuple[MODEL_TENSOR, ...] = {
        "linear_attn.conv1d.weight": (MODEL_TENSOR.SSM_CONV1D_Q, MODEL_TENSOR.SSM_CONV1D_K, MODEL_TENSOR.SSM_CONV1D_V),
        "self_attn.kv_b_proj.weight": (MODEL_TENSOR.ATTN_K_B, MODEL_TENSOR.ATTN_V_B),
        "mlp.experts.gate_up_proj": (MODEL_TENSOR.FFN_GATE_EXP, MODEL_TENSOR.FFN_UP_EXP),
        "mlp.experts.down_proj": (MODEL_TENSOR.FFN_DOWN_EXP,),
    }[m[2]]
    return tuple(TENSOR_NAMES[k].format(bid=int(m[1])) + ".weight" for k in kinds)


def kimi_join(name: str, parts: list[np.ndarray], raw: dict[str, Any]) -> np.ndarray:
    if name.endswith("conv1d.weight"):  # three [1, C, 1, W] -> [3C, W]
        return np.concatenate([p.reshape(-1, p.shape[-1]) for p in parts], axis=0)
    if name.endswith("kv_b_proj.weight"):  # [H, rank, nope] and [H, v, rank] -> [H * (nope + v), rank]
        k_b, v_b = parts
        return np.concatenate([k_b.swapaxes(1, 2), v_b], axis=1).reshape(-1, k_b.shape[1])
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)


KIMI_LINEAR = GGUFFamily(
    "kimi-linear", "kimi_linear", "KIMI_LINEAR", config=kimi_config, hub=kimi_hub, fused=kimi_fused, join=kimi_join
)

FAMILY = Family(
    name="kimi_linear",
    model_types=("kimi_linear",),
    normalize=kimi_linear,
    names=kimi_names,
    expert_names=mixtral_expert_name,
    gguf=(KIMI_LINEAR,),
)
