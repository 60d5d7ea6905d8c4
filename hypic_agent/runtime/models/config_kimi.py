"""``HybridConfig`` normalizer of ``kimi_linear`` (Kimi Linear: KDA + MLA with NoPE + DeepSeek-style MoE).

Checkpoints keep the linear layers' shape in ``linear_attn_config`` (``num_heads``, ``head_dim``,
``short_conv_kernel_size``, 1-indexed ``kda_layers`` / ``full_attn_layers``); transformers' config
class reads the same fields at the top level too. Dense MLP layers: ``mlp_layer_types`` or the
first ``first_k_dense_replace`` layers.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypic_agent.errors import ModelConfigError
from hypic_agent.runtime.models.config import HybridConfig, LayerKind, MLAShape, eos_of


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
    return HybridConfig(
        model_type=model_type,
        family="kimi_linear",
        vocab_size=int(raw["vocab_size"]),
        hidden_size=int(raw["hidden_size"]),
        layer_types=_layer_types(raw, n, lin),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
        norm_zero_centered=False,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        hidden_act=str(raw.get("hidden_act", "silu")),
        max_position_embeddings=int(raw.get("max_position_embeddings", 1048576)),
        num_attention_heads=attn_heads,
        num_key_value_heads=attn_heads,  # per-head keys and values after the latent expansion
        head_dim=qk,
        rotary_dim=0,  # NoPE
        attn_output_gate=False,
        qk_norm=False,
        attention_bias=bool(raw.get("attention_bias", False)),
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
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=eos_of(raw),
    )


def bailing_hybrid(raw: dict[str, Any], model_type: str) -> HybridConfig:
    """Ling 3 (transformers' ``bailing_hybrid``): Kimi Linear's layout with full-rank KDA gates (the forget
    gate bounded by ``kda_lower_bound`` when ``kda_safe_gate``), MLA *with* interleaved RoPE on the
    ``qk_rope_head_dim`` part and a per-head sigmoid output gate; every ``layer_group_size``-th layer
    is attention. Not Ring-linear (``bailing_moe_linear``: Lightning with RoPE inside)."""
    n = int(raw["num_hidden_layers"])
    group = int(raw.get("layer_group_size", 6))
    heads = int(raw.get("num_attention_heads", 32))
    types = raw.get("layer_types") or [
        "full_attention" if (i + 1) % group == 0 else "linear_attention" for i in range(n)
    ]
    kimi = {
        "first_k_dense_replace": 2,
        **raw,
        "layer_types": types,
        "linear_attn_config": {
            "num_heads": heads,
            "head_dim": int(raw.get("linear_head_dim") or raw.get("head_dim") or 128),
            "short_conv_kernel_size": int(raw.get("short_conv_kernel_size", 4)),
        },
    }
    cfg = kimi_linear(kimi, model_type)
    assert cfg.mla is not None
    theta = float((raw.get("rope_parameters") or {}).get("rope_theta", raw.get("rope_theta", 6_000_000.0)))
    rope_type = (raw.get("rope_parameters") or {}).get("rope_type", "default")
    if rope_type not in ("default", None):
        raise ModelConfigError(f"rope_type {rope_type!r} is not supported yet (only 'default')")
    safe = bool(raw.get("kda_safe_gate", True))
    return replace(
        cfg,
        family="bailing_hybrid",
        max_position_embeddings=int(raw.get("max_position_embeddings", raw.get("model_max_length", 262144))),
        rotary_dim=cfg.mla.qk_rope_head_dim,
        rope_theta=theta,
        mla=replace(cfg.mla, head_gate=True),
        kda_variant="ling",
        kda_lower_bound=float(raw.get("kda_lower_bound", -5.0)) if safe else None,
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
    )
