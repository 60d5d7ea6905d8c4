"""GGUF ``kimi-linear`` (Kimi Linear: KDA + MLA + DeepSeek-style MoE) -> a ``kimi_linear`` config dict
and our tensor names.

What llama.cpp's converter (``KimiLinearModel``) does, and how we read it back:

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
from typing import Any

import numpy as np

from hypic_agent.errors import ModelConfigError
from hypic_agent.runtime.models.config import HybridConfig
from hypic_agent.runtime.models.loading.gguf_meta import GGUFFamily, GGUFMeta, common_config, per_layer

_SIGMOID = 2  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID
_LAYER = re.compile(r"^model\.layers\.(\d+)\.([a-z_]+)\.(.+)$")
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
    m = _LAYER.match(name)
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
