"""``HybridConfig`` normalizers of the families whose linear layers are not Gated DeltaNet:

* ``lfm2`` (LiquidAI LFM2): gated short-convolution layers (``conv``) plus GQA attention with
  per-head q/k RMSNorm; plain RMSNorm ``w * y``; SwiGLU feed-forward whose width follows
  transformers' ``block_auto_adjust_ff_dim`` rule;
* ``granitemoehybrid`` (IBM Granite 4): Mamba2 layers (``mamba``) plus attention without RoPE
  (``position_embedding_type`` None) scaled by ``attention_multiplier``; a routed MoE (softmax
  over the top-k logits) plus an ungated shared MLP, or the shared MLP alone with 0 experts; the
  embedding / residual / logits multipliers;
* ``nemotron_h`` (NVIDIA Nemotron-H): blocks of one norm + one mixer each (Mamba2, attention without
  RoPE, squared-ReLU MLP); a mixer block and the MLP block after it become one of our layers, a
  mixer block without one a layer without feed-forward (``ffn_layers``); MoE blocks are refused;
* ``minimax`` (MiniMax-Text-01 / M1): Lightning attention layers (``lightning``) and RoPE attention,
  MoE without a shared expert, a post-norm residual with per-kind (alpha, beta) factors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypic_agent.errors import ModelConfigError
from hypic_agent.runtime.models.config import HybridConfig, LayerKind, eos_of, rope_of
from hypic_agent.runtime.models.config_falcon import falcon_h1
from hypic_agent.runtime.models.config_kimi import bailing_hybrid, kimi_linear
from hypic_agent.runtime.models.config_ring import bailing_moe_linear


def _kinds(types: list[str], linear: tuple[str, ...], attention: tuple[str, ...]) -> tuple[LayerKind, ...]:
    out: list[LayerKind] = []
    for t in types:
        if t in linear:
            out.append("linear")
        elif t in attention:
            out.append("attention")
        else:
            raise ModelConfigError(f"unknown layer type {t!r} in layer_types")
    return tuple(out)


def _float(x: Any) -> float:
    """A number of config.json; transformers writes infinities as ``{"__float__": "Infinity"}``."""
    return float(x["__float__"]) if isinstance(x, dict) else float(x)


def _lfm2_ff(raw: dict[str, Any]) -> int:
    """transformers' ``Lfm2MLP`` width: 2/3 of ``intermediate_size`` times the multiplier, rounded up
    to ``block_multiple_of`` (when ``block_auto_adjust_ff_dim``)."""
    size = int(raw["block_ff_dim"] if "block_ff_dim" in raw else raw["intermediate_size"])
    if raw.get("block_auto_adjust_ff_dim", True):
        size = int(2 * size / 3)
        mult = raw.get("block_ffn_dim_multiplier", 1.0)
        if mult is not None:
            size = int(mult * size)
            of = int(raw.get("block_multiple_of", 256))
            size = of * ((size + of - 1) // of)
    return size


def lfm2(raw: dict[str, Any], model_type: str) -> HybridConfig:
    n = int(raw["num_hidden_layers"])
    types = raw.get("layer_types")
    if types is None:
        full = set(raw.get("full_attn_idxs") or range(n))
        types = ["full_attention" if i in full else "conv" for i in range(n)]
    if len(types) != n:
        raise ModelConfigError(f"layer_types has {len(types)} entries for {n} layers")
    hidden = int(raw["hidden_size"])
    heads = int(raw["num_attention_heads"])
    head_dim = int(raw.get("head_dim") or hidden // heads)
    raw = {"rope_theta": 1000000.0, **raw}  # transformers' Lfm2Config default
    theta, rotary_dim = rope_of(raw, head_dim)
    return HybridConfig(
        model_type=model_type,
        family="lfm2",
        vocab_size=int(raw["vocab_size"]),
        hidden_size=hidden,
        layer_types=_kinds(list(types), ("conv",), ("full_attention", "attention")),
        rms_norm_eps=float(raw.get("norm_eps", 1e-5)),
        norm_zero_centered=False,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", raw.get("tie_embedding", True))),
        max_position_embeddings=int(raw.get("max_position_embeddings", 128000)),
        num_attention_heads=heads,
        num_key_value_heads=int(raw.get("num_key_value_heads", heads)),
        head_dim=head_dim,
        rotary_dim=rotary_dim,
        rope_theta=theta,
        attn_output_gate=False,
        qk_norm=True,
        linear_kind="short_conv",
        linear_conv_kernel_dim=int(raw.get("conv_L_cache", 3)),
        linear_conv_bias=bool(raw.get("conv_bias", False)),
        linear_proj_bias=bool(raw.get("conv_bias", False)),
        linear_out_bias=bool(raw.get("conv_bias", False)),
        intermediate_size=_lfm2_ff(raw),
        moe_layers=tuple(False for _ in range(n)),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=eos_of(raw),
    )


def granite_moe_hybrid(raw: dict[str, Any], model_type: str) -> HybridConfig:
    n = int(raw["num_hidden_layers"])
    types = raw.get("layer_types") or raw.get("layers_block_type") or ["mamba"] * n
    if len(types) != n:
        raise ModelConfigError(f"layer_types has {len(types)} entries for {n} layers")
    hidden = int(raw["hidden_size"])
    heads = int(raw["num_attention_heads"])
    head_dim = int(raw.get("head_dim") or hidden // heads)
    rope = raw.get("position_embedding_type") == "rope"
    theta, rotary_dim = rope_of(raw, head_dim) if rope else (10000.0, 0)
    m_heads = int(raw.get("mamba_n_heads", 128))
    inner = int(raw.get("mamba_expand", 2)) * hidden
    d_head = raw.get("mamba_d_head", "auto")
    d_head = inner // m_heads if d_head in (None, "auto") else int(d_head)
    if d_head * m_heads != inner:
        raise ModelConfigError(f"mamba_d_head {d_head} x mamba_n_heads {m_heads} != mamba_expand x hidden {inner}")
    experts = int(raw.get("num_local_experts", 0) or 0)
    limit = raw.get("time_step_limit") or (0.0, float("inf"))
    return HybridConfig(
        model_type=model_type,
        family="granitemoehybrid",
        vocab_size=int(raw["vocab_size"]),
        hidden_size=hidden,
        layer_types=_kinds(list(types), ("mamba", "linear_attention"), ("attention", "full_attention")),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        norm_zero_centered=False,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        hidden_act=str(raw.get("hidden_act", "silu")),
        max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
        num_attention_heads=heads,
        num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        rotary_dim=rotary_dim,
        rope_theta=theta,
        attn_output_gate=False,
        qk_norm=False,
        attention_bias=bool(raw.get("attention_bias", False)),
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
        linear_dt_limit=(_float(limit[0]), _float(limit[1])),
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
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=eos_of(raw),
    )


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
    hidden = int(raw["hidden_size"])
    heads = int(raw["num_attention_heads"])
    return HybridConfig(
        model_type=model_type,
        family="nemotron_h",
        vocab_size=int(raw["vocab_size"]),
        hidden_size=hidden,
        layer_types=kinds,
        rms_norm_eps=float(raw.get("layer_norm_epsilon", 1e-5)),
        norm_zero_centered=False,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
        num_attention_heads=heads,
        num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(raw.get("head_dim") or hidden // heads),
        rotary_dim=0,  # no positional encoding in the attention blocks
        attn_output_gate=False,
        qk_norm=False,
        attention_bias=bool(raw.get("attention_bias", False)),
        linear_kind="mamba2",
        linear_num_key_heads=int(raw.get("n_groups", 8)),
        linear_num_value_heads=int(raw.get("mamba_num_heads", 128)),
        linear_key_head_dim=int(raw.get("ssm_state_size", 128)),
        linear_value_head_dim=int(raw.get("mamba_head_dim", 64)),
        linear_conv_kernel_dim=int(raw.get("conv_kernel", 4)),
        linear_conv_bias=bool(raw.get("use_conv_bias", True)),
        linear_proj_bias=bool(raw.get("mamba_proj_bias", False)),
        linear_out_bias=bool(raw.get("use_bias", False)),
        linear_dt_limit=(_float(raw.get("time_step_min", 0.001)), float("inf")),  # as transformers clamps
        ffn_act="relu2",
        ffn_layers=ffn,
        hf_blocks=blocks,
        intermediate_size=int(raw.get("intermediate_size", 0)),
        moe_layers=tuple(False for _ in kinds),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=eos_of(raw),
    )


def minimax(raw: dict[str, Any], model_type: str) -> HybridConfig:
    """MiniMax (Text-01 / M1): Lightning and RoPE attention layers, MoE without a shared expert,
    the residual carrying normed states with per-kind (alpha, beta) factors."""
    n = int(raw["num_hidden_layers"])
    types = raw.get("layer_types") or ["full_attention" if (i + 1) % 2 else "linear_attention" for i in range(n)]
    if raw.get("sliding_window"):
        raise ModelConfigError("MiniMax with sliding_window attention is not supported yet")
    hidden = int(raw["hidden_size"])
    heads = int(raw["num_attention_heads"])
    head_dim = int(raw.get("head_dim") or hidden // heads)
    theta, _ = rope_of({"rope_theta": 1000000.0, **raw, "partial_rotary_factor": 1.0}, head_dim)

    def ab(prefix: str) -> tuple[float, float]:
        return float(raw.get(f"{prefix}_alpha_factor", 1)), float(raw.get(f"{prefix}_beta_factor", 1))

    return HybridConfig(
        model_type=model_type,
        family="minimax",
        vocab_size=int(raw["vocab_size"]),
        hidden_size=hidden,
        layer_types=_kinds(list(types), ("linear_attention",), ("full_attention", "attention")),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
        norm_zero_centered=False,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        hidden_act=str(raw.get("hidden_act", "silu")),
        max_position_embeddings=int(raw.get("max_position_embeddings", 131072)),
        num_attention_heads=heads,
        num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        rotary_dim=head_dim,  # transformers rotates the whole head
        rope_theta=theta,
        attn_output_gate=False,
        qk_norm=False,
        linear_kind="lightning",
        linear_num_key_heads=heads,
        linear_num_value_heads=heads,
        linear_key_head_dim=head_dim,
        linear_value_head_dim=head_dim,
        linear_conv_kernel_dim=1,
        num_experts=int(raw.get("num_local_experts", 8)),
        num_experts_per_tok=int(raw.get("num_experts_per_tok", 2)),
        moe_intermediate_size=int(raw["intermediate_size"]),
        shared_expert_intermediate_size=0,
        norm_topk_prob=True,
        moe_layers=tuple(True for _ in range(n)),
        postnorm_residual=True,
        linear_residual=ab("linear_attn"),
        attention_residual=ab("full_attn"),
        mlp_residual=ab("mlp"),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=eos_of(raw),
    )


NORMALIZERS: dict[str, Callable[[dict[str, Any], str], HybridConfig]] = {
    "lfm2": lfm2,
    "granitemoehybrid": granite_moe_hybrid,
    "nemotron_h": nemotron_h,
    "minimax": minimax,
    "kimi_linear": kimi_linear,
    "bailing_moe_linear": bailing_moe_linear,
    "bailing_hybrid": bailing_hybrid,
    "falcon_h1": falcon_h1,
}
