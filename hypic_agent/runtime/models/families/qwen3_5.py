"""Qwen3.5 (``qwen3_5``: dense and MoE, text and multimodal-wrapper configs): Gated DeltaNet layers
around gated attention (output gate, zero-centred q/k RMSNorm, partial RoPE), zero-centred norms
``y * (1 + w)``, a softmax-routed MoE with a sigmoid-gated shared expert. Checkpoints use our tensor
names (transformers' ``Qwen3_5ForCausalLM``); Qwen3-Next (``qwen3_next.py``) shares all of this but
its fused ``in_proj_qkvz``.

GGUF ``qwen35`` / ``qwen35moe`` (and ``qwen3next``): what llama.cpp's converter (``Qwen3NextModel``;
``Qwen3_5TextModel`` / ``Qwen3_5MoeTextModel`` on top of it) does, and how we read it back:


* metadata: the usual attention keys plus ``ssm.conv_kernel``, ``ssm.state_size`` (key head dim),
  ``ssm.group_count`` (key heads), ``ssm.time_step_rank`` (value heads), ``ssm.inner_size`` (value
  heads x value head dim), ``full_attention_interval`` (the layer pattern: every n-th layer is full
  attention; ``layer_types`` is not stored), ``rope.dimension_count`` (the rotary part of a head);
  experts as ``expert_*`` keys. Qwen3.5's MRoPE sections are stored too: with text-only positions
  MRoPE is plain RoPE on the rotary part, which is what we run. Qwen3.5's multi-token-prediction
  block is appended as extra blocks (``block_count`` includes ``nextn_predict_layers``): skipped.
* values: ``A = -exp(A_log)``; ``dt_bias`` as ``ssm_dt.bias``; the conv kernel squeezed to
  ``[C, W]``; **every zero-centred RMSNorm weight stored as ``1 + w``** (input / post-attention /
  final norms and the Q/K norms; not the gated DeltaNet norm) - we subtract the 1 back.
* Qwen3-Next's fused ``in_proj_qkvz`` (per key head ``[q, k, v, z]``) is split into ``attn_qkv``
  (all q, all k, all v) and ``attn_gate`` (z): put back per key head (``join``). ``in_proj_ba``
  stays as ``ssm_ba``.
* Qwen3.5 (dense and MoE) with fewer key than value heads: the value heads are reordered from
  grouped-by-key-head to tiled order (``[G0v0, G1v0, ..., G0v1, ...]``) in ``in_proj_qkv``'s V rows,
  ``in_proj_z``, ``in_proj_a`` / ``in_proj_b``, ``A_log``, ``dt_bias``, the conv kernel's V channels and
  ``out_proj``'s columns: undone here (``values``).
* experts stacked ``[E, ...]`` as ``ffn_{gate,up,down}_exps`` (gate and up concatenated back into
  transformers' ``gate_up_proj``).

llama.cpp always renormalises the top-k expert weights for these architectures and always uses the
gated attention output: the configs we build say so (``norm_topk_prob``, ``attn_output_gate``).
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import numpy as np

from hypic_agent.errors import ModelConfigError
from hypic_agent.runtime.models.config import HybridConfig
from hypic_agent.runtime.models.families.common import Family, gqa_heads, hybrid_config, layer_kinds, rope_of
from hypic_agent.runtime.models.loading.gguf_meta import GGUFFamily, GGUFMeta, common_config


# ---------------------------------------------------------------------------- config.json
def text_config(raw: dict[str, Any]) -> dict[str, Any]:
    """A Qwen3.5 multimodal wrapper config (``text_config`` inside): its text model's config dict
    (``model_type`` ``qwen3_5_text`` / ``qwen3_5_moe_text``, the wrapper's tying); any other config as
    it is."""
    model_type = raw.get("model_type")
    if model_type in ("qwen3_5", "qwen3_5_moe") and isinstance(raw.get("text_config"), dict):
        text = dict(raw["text_config"])
        text.setdefault("model_type", f"{model_type}_text")
        for k in ("tie_word_embeddings",):
            if k in raw and k not in text:
                text[k] = raw[k]
        return text
    return raw


def qwen_hybrid(raw: dict[str, Any], model_type: str, family: str, *, fused_qkvz: bool = False) -> HybridConfig:
    """Qwen3.5 / Qwen3-Next: every ``full_attention_interval``-th layer attention, the rest Gated
    DeltaNet; ``fused_qkvz``: Qwen3-Next's checkpoint layout (``in_proj_qkvz`` / ``in_proj_ba``)."""
    n = int(raw["num_hidden_layers"])
    types = raw.get("layer_types")
    if types is None:
        interval = int(raw.get("full_attention_interval", 4))
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)]
    if len(types) != n:
        raise ModelConfigError(f"layer_types has {len(types)} entries for {n} layers")
    kinds = layer_kinds(list(types), ("linear_attention",), ("full_attention",))
    heads = gqa_heads(raw)
    num_experts = int(raw.get("num_experts", 0) or 0)
    if model_type in ("qwen3_5", "qwen3_5_text"):
        num_experts = 0
    if num_experts:
        step = int(raw.get("decoder_sparse_step", 1) or 1)
        only = set(raw.get("mlp_only_layers", []) or [])
        moe = tuple((i not in only) and ((i + 1) % step == 0) for i in range(n))
    else:
        moe = tuple(False for _ in range(n))
    base = hybrid_config(
        raw, model_type, family, kinds, heads=heads, rope=rope_of(raw, heads[2]), eps=1e-6, max_positions=32768
    )
    return replace(
        base,
        norm_zero_centered=True,
        attn_output_gate=bool(raw.get("attn_output_gate", True)),
        qk_norm=True,
        linear_num_key_heads=int(raw["linear_num_key_heads"]),
        linear_num_value_heads=int(raw["linear_num_value_heads"]),
        linear_key_head_dim=int(raw["linear_key_head_dim"]),
        linear_value_head_dim=int(raw["linear_value_head_dim"]),
        linear_conv_kernel_dim=int(raw.get("linear_conv_kernel_dim", 4)),
        linear_fused_qkvz=fused_qkvz,
        intermediate_size=int(raw.get("intermediate_size", 0) or 0),
        num_experts=num_experts,
        num_experts_per_tok=int(raw.get("num_experts_per_tok", 0) or 0),
        moe_intermediate_size=int(raw.get("moe_intermediate_size", 0) or 0),
        shared_expert_intermediate_size=int(raw.get("shared_expert_intermediate_size", 0) or 0),
        norm_topk_prob=bool(raw.get("norm_topk_prob", True)),
        moe_layers=moe,
    )


def qwen3_5(raw: dict[str, Any], model_type: str) -> HybridConfig:
    return qwen_hybrid(raw, model_type, "qwen3_5")


# ---------------------------------------------------------------------------- GGUF
# zero-centred norms the converter stores as 1 + w (GGUF names)
_PLUS_ONE = ("attn_norm.weight", "post_attention_norm.weight", "output_norm.weight", "q_norm.weight", "k_norm.weight")
_FUSED = re.compile(
    r"^model\.layers\.(\d+)\.(mlp\.experts\.gate_up_proj|mlp\.experts\.down_proj|linear_attn\.in_proj_qkvz\.weight)$"
)


def gguf_config(meta: GGUFMeta, model_type: str) -> dict[str, Any]:
    # Qwen3.5's converter appends its multi-token-prediction block(s) to block_count: not ours to run
    n = int(meta.require("block_count")) - int(meta.get("nextn_predict_layers", 0) or 0)
    heads = int(meta.require("attention.head_count"))
    hidden = int(meta.require("embedding_length"))
    head_dim = int(meta.get("attention.key_length", hidden // heads))
    interval = int(meta.get("full_attention_interval", 4))
    v_heads = int(meta.require("ssm.time_step_rank"))
    inner = int(meta.require("ssm.inner_size"))
    k_heads = int(meta.require("ssm.group_count"))
    if v_heads <= 0 or inner % v_heads or k_heads <= 0 or v_heads % k_heads:
        raise ModelConfigError(
            f"GGUF {meta.arch}: ssm.inner_size {inner}, time_step_rank {v_heads} and group_count {k_heads} "
            "do not describe a Gated DeltaNet layer",
            param="model",
        )
    rotary = int(meta.get("rope.dimension_count", head_dim))
    experts = int(meta.get("expert_count", 0) or 0)
    return {
        "model_type": model_type,
        **common_config(meta),
        "num_hidden_layers": n,
        "layer_types": ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)],
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta.get("attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "max_position_embeddings": int(meta.get("context_length", 32768)),
        "rms_norm_eps": float(meta.get("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": float(meta.get("rope.freq_base", 10000.0)),
            "partial_rotary_factor": rotary / head_dim,
        },
        "attn_output_gate": True,
        "attention_bias": any(k.endswith("attn_q.bias") for k in meta.shapes),
        "linear_num_key_heads": k_heads,
        "linear_num_value_heads": v_heads,
        "linear_key_head_dim": int(meta.require("ssm.state_size")),
        "linear_value_head_dim": inner // v_heads,
        "linear_conv_kernel_dim": int(meta.require("ssm.conv_kernel")),
        "intermediate_size": int(meta.get("feed_forward_length", 0) or 0),
        "num_experts": experts,
        "num_experts_per_tok": int(meta.get("expert_used_count", 0) or 0),
        "moe_intermediate_size": int(meta.get("expert_feed_forward_length", 0) or 0),
        "shared_expert_intermediate_size": int(meta.get("expert_shared_feed_forward_length", 0) or 0),
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    }


def qwen35_config(meta: GGUFMeta) -> dict[str, Any]:
    if int(meta.get("expert_count", 0) or 0):
        raise ModelConfigError("GGUF qwen35 with experts: a Qwen3.5 MoE is written as qwen35moe", param="model")
    return gguf_config(meta, "qwen3_5_text")


def qwen35moe_config(meta: GGUFMeta) -> dict[str, Any]:
    return gguf_config(meta, "qwen3_5_moe_text")


def qwen_hub(cfg: HybridConfig, name: str) -> str:
    """The converter renames ``dt_bias`` to ``dt_proj.bias`` (-> ``ssm_dt.bias``)."""
    return name[: -len("dt_bias")] + "dt_proj.bias" if name.endswith(".linear_attn.dt_bias") else name


def qwen_fused(cfg: HybridConfig, name: str) -> tuple[str, ...] | None:
    """Tensors the converter splits: stacked experts, Qwen3-Next's ``in_proj_qkvz``."""
    from gguf import MODEL_TENSOR, TENSOR_NAMES

    m = _FUSED.match(name)
    if m is None:
        return None
    kinds: tuple[MODEL_TENSOR, ...] = {
        "mlp.experts.gate_up_proj": (MODEL_TENSOR.FFN_GATE_EXP, MODEL_TENSOR.FFN_UP_EXP),
        "mlp.experts.down_proj": (MODEL_TENSOR.FFN_DOWN_EXP,),
        "linear_attn.in_proj_qkvz.weight": (MODEL_TENSOR.ATTN_QKV, MODEL_TENSOR.ATTN_GATE),
    }[m[2]]
    return tuple(TENSOR_NAMES[k].format(bid=int(m[1])) + ".weight" for k in kinds)


def qwen_join(name: str, parts: list[np.ndarray], raw: dict[str, Any]) -> np.ndarray:
    """``[attn_qkv, attn_gate]`` -> ``in_proj_qkvz`` rows per key head ``[q, k, v, z]``; experts'
    gate and up concatenated along dim 1."""
    if not name.endswith("in_proj_qkvz.weight"):
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
    qkv, z = parts
    k_heads, dk = int(raw["linear_num_key_heads"]), int(raw["linear_key_head_dim"])
    cols = qkv.shape[-1]
    q = qkv[: k_heads * dk].reshape(k_heads, dk, cols)
    k = qkv[k_heads * dk : 2 * k_heads * dk].reshape(k_heads, dk, cols)
    v = qkv[2 * k_heads * dk :].reshape(k_heads, -1, cols)
    return np.concatenate([q, k, v, z.reshape(k_heads, -1, cols)], axis=1).reshape(-1, cols)


def zero_centred(name: str, w: np.ndarray, raw: dict[str, Any]) -> np.ndarray:
    return w - np.float32(1.0) if name.endswith(_PLUS_ONE) else w


def _grouped(w: np.ndarray, axis: int, k_heads: int, per_k: int, head_dim: int) -> np.ndarray:
    """Tiled value-head order (``[G0v0, G1v0, ...]``) back to grouped by key head along ``axis``."""
    w = np.moveaxis(w, axis, 0)
    shape = w.shape
    w = w.reshape(per_k, k_heads, head_dim, *shape[1:]).swapaxes(0, 1).reshape(shape)
    return np.ascontiguousarray(np.moveaxis(w, 0, axis))


def qwen35_values(name: str, w: np.ndarray, raw: dict[str, Any]) -> np.ndarray:
    """Qwen3.5: the +1 norms, then the value-head reorder undone (when key heads < value heads)."""
    w = zero_centred(name, w, raw)
    k_heads, v_heads = int(raw["linear_num_key_heads"]), int(raw["linear_num_value_heads"])
    if k_heads == v_heads or (".ssm_" not in name and ".attn_qkv." not in name and ".attn_gate." not in name):
        return w
    per_k, dv, qk = v_heads // k_heads, int(raw["linear_value_head_dim"]), 2 * k_heads * int(raw["linear_key_head_dim"])
    if name.endswith((".attn_qkv.weight", ".ssm_conv1d.weight")):
        return np.concatenate([w[:qk], _grouped(w[qk:], 0, k_heads, per_k, dv)], axis=0)
    if name.endswith(".attn_gate.weight"):
        return _grouped(w, 0, k_heads, per_k, dv)
    if name.endswith((".ssm_beta.weight", ".ssm_alpha.weight", ".ssm_a", ".ssm_dt.bias")):
        return _grouped(w, 0, k_heads, per_k, 1)
    if name.endswith(".ssm_out.weight"):
        return _grouped(w, 1, k_heads, per_k, dv)
    return w


_QWEN35 = GGUFFamily("qwen35", "qwen3_5_text", "QWEN35", config=qwen35_config, hub=qwen_hub, values=qwen35_values)
_QWEN35MOE = GGUFFamily(
    "qwen35moe", "qwen3_5_moe_text", "QWEN35MOE", config=qwen35moe_config, hub=qwen_hub, fused=qwen_fused,
    values=qwen35_values, join=qwen_join,
)  # fmt: skip

FAMILY = Family(
    name="qwen3_5",
    model_types=("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"),
    normalize=qwen3_5,
    shapes_from_model=False,
    gguf=(_QWEN35, _QWEN35MOE),
)
