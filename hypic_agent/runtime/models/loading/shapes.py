"""The naming contract's tensors for a config: every name with its shape, and the check of a loaded
state dict against them (``validate_state_dict``), which every loader runs before a model is built.
"""

from __future__ import annotations

import torch

from hypic_agent.errors import WeightsError
from hypic_agent.runtime.models.config import HybridConfig
from hypic_agent.runtime.models.families import SHAPES_FROM_MODEL
from hypic_agent.runtime.models.hybrid import build_model

Shape = tuple[int, ...]


def expected_shapes(cfg: HybridConfig) -> dict[str, Shape]:
    """Every tensor name of the naming contract for ``cfg`` with its shape (``SHAPES_FROM_MODEL``, all but
    Qwen and Llama: read off the model built on the meta device)."""
    if cfg.family in SHAPES_FROM_MODEL:
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
