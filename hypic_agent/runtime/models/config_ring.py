"""HF config normalizer of Ring-linear (``bailing_moe_linear``: inclusionAI's Ring-mini/flash-linear-2.0).

Layers: ``(i + 1) % layer_group_size == 0`` is a GQA attention layer (fused ``query_key_value``, per-head
q/k RMSNorm, partial NeoX RoPE), every other one a Lightning linear-attention layer with RoPE inside
(``lightning_rope``: the same heads, head dim, rotary dims and theta as the attention layers, MHA). The
first ``first_k_dense_replace`` layers have a dense MLP, the rest a MoE with a sigmoid router (expert
bias, grouped top-k, ``routed_scaling_factor``) and ungated shared experts. Plain (``y * w``) norms.
Ring-2.5's MLA attention layers (``kv_lora_rank`` in the config) are not supported.
"""

from __future__ import annotations

from typing import Any

from hypic_agent.errors import ModelConfigError
from hypic_agent.runtime.models.config import HybridConfig, eos_of, rope_of


def bailing_moe_linear(raw: dict[str, Any], model_type: str) -> HybridConfig:
    if raw.get("kv_lora_rank"):
        raise ModelConfigError("Ring-linear with MLA attention layers (Ring-2.5) is not supported yet")
    if str(raw.get("score_function", "sigmoid")) != "sigmoid" or not raw.get("moe_router_enable_expert_bias", True):
        raise ModelConfigError("Ring-linear with a softmax router is not supported yet (sigmoid + expert bias only)")
    n = int(raw["num_hidden_layers"])
    group = int(raw.get("layer_group_size", 4))
    kinds = tuple("attention" if group > 0 and (i + 1) % group == 0 else "linear" for i in range(n))
    hidden = int(raw["hidden_size"])
    heads = int(raw["num_attention_heads"])
    head_dim = int(raw.get("head_dim") or hidden // heads)
    theta, rotary_dim = rope_of({"rope_theta": 600000.0, **raw}, head_dim)
    k_dense = int(raw.get("first_k_dense_replace", 0))
    n_experts = int(raw.get("num_experts", 0))
    moe_inter = int(raw.get("moe_intermediate_size", 0))
    shared = int(raw.get("moe_shared_expert_intermediate_size") or moe_inter) * int(raw.get("num_shared_experts", 0))
    bias = bool(raw.get("use_bias", False))
    return HybridConfig(
        model_type=model_type,
        family="bailing_moe_linear",
        vocab_size=int(raw["vocab_size"]),
        hidden_size=hidden,
        layer_types=kinds,  # type: ignore[arg-type]
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        norm_zero_centered=False,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        hidden_act=str(raw.get("hidden_act", "silu")),
        max_position_embeddings=int(raw.get("max_position_embeddings", 131072)),
        num_attention_heads=heads,
        num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        rotary_dim=rotary_dim,
        rope_theta=theta,
        attn_output_gate=False,
        qk_norm=bool(raw.get("use_qk_norm", False)),
        attention_bias=bias or bool(raw.get("use_qkv_bias", False)),
        linear_kind="lightning_rope",
        linear_num_key_heads=heads,
        linear_num_value_heads=heads,
        linear_key_head_dim=head_dim,
        linear_value_head_dim=head_dim,
        linear_conv_kernel_dim=1,
        linear_proj_bias=bias or bool(raw.get("use_qkv_bias", False)),
        linear_out_bias=bias,
        linear_silu=bool(raw.get("linear_silu", raw.get("use_linear_silu", False))),
        linear_qk_norm=bool(raw.get("use_qk_norm", False)),
        linear_group_norm=int(raw.get("group_norm_size", 1)),
        intermediate_size=int(raw.get("intermediate_size", 0)),
        num_experts=n_experts,
        num_experts_per_tok=int(raw.get("num_experts_per_tok", 0)),
        moe_intermediate_size=moe_inter,
        shared_expert_intermediate_size=shared,
        shared_expert_gate=False,
        norm_topk_prob=bool(raw.get("norm_topk_prob", True)),
        router="sigmoid",
        routed_scaling_factor=float(raw.get("routed_scaling_factor", 1.0)),
        router_groups=(int(raw.get("n_group") or 1), int(raw.get("topk_group") or 1)),
        moe_layers=tuple(n_experts > 1 and i >= k_dense for i in range(n)),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=eos_of(raw),
    )
