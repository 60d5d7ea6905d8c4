"""``HybridConfig``: one normalized description of every architecture we serve.

Built from a Hugging Face ``config.json`` dict (``HybridConfig.from_hf``). The model code reads
only this dataclass, never the raw HF dict, so a new ``model_type`` needs one normalizer here
plus (if its layers differ) one module file.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from hypic_agent.errors import ModelConfigError
from hypic_agent.runtime.models.parallel_scales import ParallelScales

LayerKind = Literal["linear", "attention"]
# the token mixer of a model's linear (fixed-state) layers: Gated DeltaNet, LFM2's gated short
# convolution (no recurrent state: the conv tail is the whole state), Mamba2's decay-only SSM,
# MiniMax's Lightning attention (decay-only with a fixed decay per head, no conv), Kimi Delta
# Attention (a delta rule with a per-key-channel decay: dense pairs like GDN), Ring-linear's Lightning
# with RoPE inside (decay-only; the cached state is re-rotated to its segment's offset)
LinearKind = Literal["gdn", "short_conv", "mamba2", "lightning", "kda", "lightning_rope"]

# model_type strings accepted, mapped to the family whose module code runs them
FAMILIES: dict[str, str] = {
    "qwen3_5": "qwen3_5",
    "qwen3_5_text": "qwen3_5",
    "qwen3_5_moe": "qwen3_5",
    "qwen3_5_moe_text": "qwen3_5",
    "qwen3_next": "qwen3_next",
    "llama": "llama",
    "lfm2": "lfm2",
    "granitemoehybrid": "granitemoehybrid",
    "nemotron_h": "nemotron_h",
    "minimax": "minimax",
    "kimi_linear": "kimi_linear",
    "bailing_moe_linear": "bailing_moe_linear",
    "bailing_hybrid": "bailing_hybrid",
    "falcon_h1": "falcon_h1",
}

MIXER_KIND_FAMILIES: frozenset[str] = frozenset(
    (
        "lfm2", "granitemoehybrid", "nemotron_h", "minimax", "kimi_linear", "bailing_moe_linear", "bailing_hybrid",
        "falcon_h1",
    )
)  # fmt: skip
"""Families normalized in ``config_families`` whose tensor names come from ``keymap`` (shapes read off
the model built on the meta device)."""


@dataclass(frozen=True)
class MLAShape:
    """Multi-head latent attention's widths (Kimi Linear; ``models/mla.py``)."""

    q_lora_rank: int  # 0: a plain q_proj
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    head_gate: bool = False  # Ling 3 (``bailing_hybrid``): ``o * sigmoid(g_proj(x))`` per head before ``o_proj``


@dataclass(frozen=True)
class HybridConfig:
    """Shapes and options of a hybrid (linear + full attention) decoder stack."""

    model_type: str  # the text model_type, e.g. "qwen3_5_moe_text", "qwen3_next", "llama"
    family: str  # "qwen3_5" | "qwen3_next" | "llama" | "lfm2" | "granitemoehybrid" | "nemotron_h" | "minimax" | ...
    vocab_size: int
    hidden_size: int
    layer_types: tuple[LayerKind, ...]
    rms_norm_eps: float = 1e-6
    norm_zero_centered: bool = True  # Qwen: y * (1 + w); Llama: y * w
    tie_word_embeddings: bool = False
    hidden_act: str = "silu"
    max_position_embeddings: int = 32768
    # full attention
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    rotary_dim: int = 64  # partial RoPE: first rotary_dim dims of each head are rotated
    rope_theta: float = 10000.0
    attn_output_gate: bool = True
    qk_norm: bool = True
    attention_bias: bool = False
    attention_scale: float | None = None  # None: head_dim ** -0.5 (Granite: attention_multiplier)
    mla: MLAShape | None = None  # Kimi Linear's latent attention (head_dim = nope + rope)
    # linear layers: ``linear_kind`` names the mixer. GDN: key heads / value heads as named.
    # Mamba2: key heads = B/C groups, key head dim = d_state, value heads = SSM heads, value head
    # dim = head_dim. Short conv: no heads (no recurrent state), conv channels = hidden size.
    linear_kind: LinearKind = "gdn"
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 4
    linear_fused_qkvz: bool = False  # qwen3_next checkpoint layout (in_proj_qkvz / in_proj_ba)
    linear_conv_bias: bool = False
    linear_proj_bias: bool = False  # Mamba2 / LFM2 in_proj
    linear_out_bias: bool = False  # Mamba2 / LFM2 out_proj
    linear_dt_limit: tuple[float, float] = (0.0, float("inf"))  # Mamba2 clamp of dt after softplus
    # Ring-linear (``lightning_rope``): SiLU on q/k/v, per-head q/k RMSNorm, groups of the output RMSNorm
    linear_silu: bool = False
    linear_qk_norm: bool = False
    linear_group_norm: int = 1
    # KDA: "kimi" (low-rank forget gate ``f_a``/``f_b`` with softplus, low-rank output gate) or "ling"
    # (Ling 3 / ``bailing_hybrid``: full-rank ``f_proj`` and ``g_proj``; the forget gate bounded as
    # ``kda_lower_bound * sigmoid(exp(A_log) * f)``, or softplus when the bound is None)
    kda_variant: str = "kimi"
    kda_lower_bound: float | None = None
    # MLP / MoE. ``ffn_act``: "swiglu" (``down(silu(gate x) * up x)``) or "relu2" (Nemotron-H:
    # ``down(relu(up x)^2)``); ``ffn_layers``: per layer whether it has a feed-forward half (empty: all)
    ffn_act: str = "swiglu"
    ffn_layers: tuple[bool, ...] = ()
    # Nemotron-H: per layer the checkpoint's (mixer block, feed-forward block or -1) indices
    hf_blocks: tuple[tuple[int, int], ...] = ()
    intermediate_size: int = 0
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = True
    shared_expert_gate: bool = True  # Qwen: sigmoid-gated shared expert; Granite: ungated
    # "softmax" (softmax, top-k, renormalize) or "sigmoid" (Kimi / DeepSeek-V3: sigmoid scores, top-k
    # by score + correction bias within the best groups, renormalized, times routed_scaling_factor)
    router: str = "softmax"
    routed_scaling_factor: float = 1.0
    router_groups: tuple[int, int] = (1, 1)  # (n_group, topk_group)
    # Granite scalings (1.0 elsewhere): embeddings * m, residual branches * m, logits / s
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    logits_scaling: float = 1.0
    # MiniMax: the residual stream carries the *normed* hidden states, and each half of a layer mixes
    # them as ``alpha * residual + beta * branch`` with (alpha, beta) per kind
    postnorm_residual: bool = False
    linear_residual: tuple[float, float] = (1.0, 1.0)
    attention_residual: tuple[float, float] = (1.0, 1.0)
    mlp_residual: tuple[float, float] = (1.0, 1.0)
    moe_layers: tuple[bool, ...] = ()  # per layer: MoE block (True) or dense MLP (False)
    # Falcon-H1: each checkpoint layer runs a Mamba2 and an attention mixer in parallel; served as two
    # layers (``layer_types`` alternates linear / attention; ``parallel_layer``) with these multipliers
    parallel: ParallelScales | None = None
    # tokens
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    # ------------------------------------------------------------------ derived
    @property
    def num_layers(self) -> int:
        return len(self.layer_types)

    @property
    def linear_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == "linear"]

    @property
    def attention_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == "attention"]

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def linear_conv_dim(self) -> int:
        """Channels of the causal conv: q, k and v projections concatenated (GDN), x, B and C
        (Mamba2: the same count), the gated input ``B * x`` (short conv: the hidden size)."""
        if self.linear_kind == "short_conv":
            return self.hidden_size
        if self.linear_kind in ("lightning", "lightning_rope"):
            return 0
        return 2 * self.linear_key_dim + self.linear_value_dim

    @property
    def linear_state_shape(self) -> tuple[int, int, int]:
        """A linear layer's recurrent state per sequence ``[HV, K, V]`` (short conv: ``[0, 0, 0]``)."""
        return (self.linear_num_value_heads, self.linear_key_head_dim, self.linear_value_head_dim)

    @property
    def linear_pair_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Shapes of a body pair's ``T`` and ``S``: GDN / KDA ``[HV, K, K]`` / ``[HV, K, V]``; Mamba2 and
        Lightning a per-head decay ``[HV]`` / ``[HV, K, V]``; short conv none (``[0]`` / ``[0, 0, 0]``)."""
        hv, k, _ = self.linear_state_shape
        if self.linear_kind in ("gdn", "kda"):
            return (hv, k, k), self.linear_state_shape
        return (hv,), self.linear_state_shape

    @property
    def attention_cache_rows(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """One token's cached attention key row and value row, ``(heads, width)`` each: per-head K and
        V ``(Hkv, D)``; MLA (``models/mla.py``) its decoupled RoPE key ``(1, rope)`` and its latent
        ``(1, kv_lora_rank)``, expanded to per-head K / V only when attention runs."""
        if self.mla is not None:
            return (1, self.mla.qk_rope_head_dim), (1, self.mla.kv_lora_rank)
        kv = (self.num_key_value_heads, self.head_dim)
        return kv, kv

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("extra", None)
        return d

    # ------------------------------------------------------------------ parsing
    @staticmethod
    def from_hf(raw: dict[str, Any]) -> HybridConfig:
        """Normalize a Hugging Face config dict (wrapper configs with ``text_config`` included)."""
        model_type = raw.get("model_type")
        if model_type in ("qwen3_5", "qwen3_5_moe") and isinstance(raw.get("text_config"), dict):
            text = dict(raw["text_config"])
            text.setdefault("model_type", f"{model_type}_text")
            for k in ("tie_word_embeddings",):
                if k in raw and k not in text:
                    text[k] = raw[k]
            raw = text
            model_type = raw["model_type"]
        if model_type not in FAMILIES:
            raise ModelConfigError(
                f"unknown model_type {model_type!r}; supported: {sorted(FAMILIES)}. "
                "Add a normalizer in hypic_agent/runtime/models/config.py and a module in the registry."
            )
        family = FAMILIES[model_type]
        try:
            if family in MIXER_KIND_FAMILIES:
                from hypic_agent.runtime.models.config_families import NORMALIZERS

                return NORMALIZERS[family](raw, model_type)
            if family == "llama":
                return _llama(raw, model_type)
            return _qwen_hybrid(raw, model_type, family)
        except KeyError as e:
            raise ModelConfigError(f"config.json for {model_type!r} lacks required field {e.args[0]!r}") from e


def _eos(raw: dict[str, Any]) -> tuple[int, ...]:
    eos = raw.get("eos_token_id")
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (int(eos),)


def rope_of(raw: dict[str, Any], head_dim: int) -> tuple[float, int]:
    """(theta, rotary dims) of a config dict: ``rope_parameters`` / ``rope_scaling`` or top level."""
    return _rope(raw, head_dim)


def eos_of(raw: dict[str, Any]) -> tuple[int, ...]:
    return _eos(raw)


def _rope(raw: dict[str, Any], head_dim: int) -> tuple[float, int]:
    rp = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    theta = float(rp.get("rope_theta", raw.get("rope_theta", 10000.0)))
    factor = float(rp.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0)))
    rope_type = rp.get("rope_type", rp.get("type", "default"))
    if rope_type not in ("default", None):
        raise ModelConfigError(f"rope_type {rope_type!r} is not supported yet (only 'default')")
    return theta, int(head_dim * factor)


def _qwen_hybrid(raw: dict[str, Any], model_type: str, family: str) -> HybridConfig:
    n = int(raw["num_hidden_layers"])
    types = raw.get("layer_types")
    if types is None:
        interval = int(raw.get("full_attention_interval", 4))
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)]
    if len(types) != n:
        raise ModelConfigError(f"layer_types has {len(types)} entries for {n} layers")
    kinds: list[LayerKind] = []
    for t in types:
        if t == "linear_attention":
            kinds.append("linear")
        elif t == "full_attention":
            kinds.append("attention")
        else:
            raise ModelConfigError(f"unknown layer type {t!r} in layer_types")
    hidden = int(raw["hidden_size"])
    heads = int(raw["num_attention_heads"])
    head_dim = int(raw.get("head_dim") or hidden // heads)
    theta, rotary_dim = _rope(raw, head_dim)
    num_experts = int(raw.get("num_experts", 0) or 0)
    if model_type in ("qwen3_5", "qwen3_5_text"):
        num_experts = 0
    if num_experts:
        step = int(raw.get("decoder_sparse_step", 1) or 1)
        only = set(raw.get("mlp_only_layers", []) or [])
        moe = tuple((i not in only) and ((i + 1) % step == 0) for i in range(n))
    else:
        moe = tuple(False for _ in range(n))
    return HybridConfig(
        model_type=model_type,
        family=family,
        vocab_size=int(raw["vocab_size"]),
        hidden_size=hidden,
        layer_types=tuple(kinds),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        norm_zero_centered=True,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        hidden_act=str(raw.get("hidden_act", "silu")),
        max_position_embeddings=int(raw.get("max_position_embeddings", 32768)),
        num_attention_heads=heads,
        num_key_value_heads=int(raw.get("num_key_value_heads", heads)),
        head_dim=head_dim,
        rotary_dim=rotary_dim,
        rope_theta=theta,
        attn_output_gate=bool(raw.get("attn_output_gate", True)),
        qk_norm=True,
        attention_bias=bool(raw.get("attention_bias", False)),
        linear_num_key_heads=int(raw["linear_num_key_heads"]),
        linear_num_value_heads=int(raw["linear_num_value_heads"]),
        linear_key_head_dim=int(raw["linear_key_head_dim"]),
        linear_value_head_dim=int(raw["linear_value_head_dim"]),
        linear_conv_kernel_dim=int(raw.get("linear_conv_kernel_dim", 4)),
        linear_fused_qkvz=(family == "qwen3_next"),
        intermediate_size=int(raw.get("intermediate_size", 0) or 0),
        num_experts=num_experts,
        num_experts_per_tok=int(raw.get("num_experts_per_tok", 0) or 0),
        moe_intermediate_size=int(raw.get("moe_intermediate_size", 0) or 0),
        shared_expert_intermediate_size=int(raw.get("shared_expert_intermediate_size", 0) or 0),
        norm_topk_prob=bool(raw.get("norm_topk_prob", True)),
        moe_layers=moe,
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=_eos(raw),
    )


def _llama(raw: dict[str, Any], model_type: str) -> HybridConfig:
    n = int(raw["num_hidden_layers"])
    hidden = int(raw["hidden_size"])
    heads = int(raw["num_attention_heads"])
    head_dim = int(raw.get("head_dim") or hidden // heads)
    theta, rotary_dim = _rope(raw, head_dim)
    return HybridConfig(
        model_type=model_type,
        family="llama",
        vocab_size=int(raw["vocab_size"]),
        hidden_size=hidden,
        layer_types=tuple("attention" for _ in range(n)),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
        norm_zero_centered=False,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        hidden_act=str(raw.get("hidden_act", "silu")),
        max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
        num_attention_heads=heads,
        num_key_value_heads=int(raw.get("num_key_value_heads", heads)),
        head_dim=head_dim,
        rotary_dim=rotary_dim,
        rope_theta=theta,
        attn_output_gate=False,
        qk_norm=False,
        attention_bias=bool(raw.get("attention_bias", False)),
        intermediate_size=int(raw["intermediate_size"]),
        moe_layers=tuple(False for _ in range(n)),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=_eos(raw),
    )
