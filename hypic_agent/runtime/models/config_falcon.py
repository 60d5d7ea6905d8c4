"""``HybridConfig`` normalizer of ``falcon_h1`` (TII Falcon-H1).

Every checkpoint layer runs a Mamba2 mixer and GQA RoPE attention in parallel on one normed input,
then a SwiGLU MLP; µP multipliers scale the embeddings, each branch's input and output, the Mamba2
input projection per section (``ssm_multipliers``: z, x, B, C, dt), the MLP's gate and output and
the logits. We serve checkpoint layer i as our layers 2i (its Mamba2 half: ``linear``) and 2i+1 (its
attention half and the MLP: ``attention``), see ``parallel_layer``. Falcon-H1's ``key_multiplier``
scales the keys before RoPE: we fold it into the attention scale (the cached keys stay unscaled).
"""

from __future__ import annotations

from typing import Any

from hypic_agent.errors import ModelConfigError
from hypic_agent.runtime.models.config import HybridConfig, LayerKind, eos_of, rope_of
from hypic_agent.runtime.models.parallel_scales import ParallelScales


def _float(x: Any) -> float:
    """A number of config.json; transformers writes infinities as ``{"__float__": "Infinity"}``."""
    return float(x["__float__"]) if isinstance(x, dict) else float(x)


def _scales(raw: dict[str, Any]) -> ParallelScales:
    sections = tuple(float(m) for m in (raw.get("ssm_multipliers") or (1.0,) * 5))
    gate, down = (float(m) for m in (raw.get("mlp_multipliers") or (1.0, 1.0)))
    if len(sections) != 5:
        raise ModelConfigError(f"ssm_multipliers needs 5 entries (z, x, B, C, dt), got {len(sections)}")
    norm = "none"
    if raw.get("mamba_rms_norm", False):
        norm = "norm_then_gate" if raw.get("mamba_norm_before_gate", True) else "gate_then_norm"
    return ParallelScales(
        attention_in=float(raw.get("attention_in_multiplier", 1.0)),
        attention_out=float(raw.get("attention_out_multiplier", 1.0)),
        ssm_in=float(raw.get("ssm_in_multiplier", 1.0)),
        ssm_out=float(raw.get("ssm_out_multiplier", 1.0)),
        ssm_sections=sections,  # type: ignore[arg-type]
        mlp_gate=gate,
        mlp_down=down,
        ssm_norm=norm,
    )


def falcon_h1(raw: dict[str, Any], model_type: str) -> HybridConfig:
    n = int(raw["num_hidden_layers"])
    if str(raw.get("hidden_act", "silu")) != "silu":
        raise ModelConfigError(f"Falcon-H1 with hidden_act {raw['hidden_act']!r} is not supported (only silu)")
    if raw.get("mlp_bias"):
        raise ModelConfigError("Falcon-H1 with mlp_bias is not supported yet")
    hidden = int(raw["hidden_size"])
    heads = int(raw["num_attention_heads"])
    head_dim = int(raw.get("head_dim") or hidden // heads)
    theta, rotary_dim = rope_of(raw, head_dim)
    m_heads = int(raw.get("mamba_n_heads", 128))
    d_ssm = raw.get("mamba_d_ssm", 1024)
    inner = int(raw.get("mamba_expand", 2)) * hidden if d_ssm is None else int(d_ssm)
    d_head = raw.get("mamba_d_head", "auto")
    d_head = inner // m_heads if d_head in (None, "auto") else int(d_head)
    if d_head * m_heads != inner:
        raise ModelConfigError(f"mamba_d_head {d_head} x mamba_n_heads {m_heads} != the Mamba2 width {inner}")
    limit = raw.get("time_step_limit") or (0.0, float("inf"))
    kinds: tuple[LayerKind, ...] = ("linear", "attention") * n
    return HybridConfig(
        model_type=model_type,
        family="falcon_h1",
        vocab_size=int(raw["vocab_size"]),
        hidden_size=hidden,
        layer_types=kinds,
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
        norm_zero_centered=False,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        max_position_embeddings=int(raw.get("max_position_embeddings", 8192)),
        num_attention_heads=heads,
        num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        rotary_dim=rotary_dim,
        rope_theta=theta,
        attn_output_gate=False,
        qk_norm=False,
        attention_bias=bool(raw.get("attention_bias", False)),
        attention_scale=float(raw.get("key_multiplier", 1.0)) * head_dim**-0.5,
        linear_kind="mamba2",
        linear_num_key_heads=int(raw.get("mamba_n_groups", 1)),
        linear_num_value_heads=m_heads,
        linear_key_head_dim=int(raw.get("mamba_d_state", 256)),
        linear_value_head_dim=d_head,
        linear_conv_kernel_dim=int(raw.get("mamba_d_conv", 4)),
        linear_conv_bias=bool(raw.get("mamba_conv_bias", True)),
        linear_proj_bias=bool(raw.get("mamba_proj_bias", False)),
        linear_out_bias=bool(raw.get("projectors_bias", False)),
        linear_dt_limit=(_float(limit[0]), _float(limit[1])),
        ffn_layers=(False, True) * n,  # the MLP sits in each attention half
        intermediate_size=int(raw["intermediate_size"]),
        moe_layers=(False, False) * n,
        embedding_multiplier=float(raw.get("embedding_multiplier", 1.0)),
        logits_scaling=1.0 / float(raw.get("lm_head_multiplier", 1.0)),
        parallel=_scales(raw),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=eos_of(raw),
    )
