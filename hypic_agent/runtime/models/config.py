"""``HybridConfig``: one normalized description of every architecture we serve.

Built from a Hugging Face ``config.json`` dict by the family's normalizer
(``families.normalize_config``). The model code reads only this dataclass, never the raw HF dict, so
a new ``model_type`` needs one family module (``families/<family>.py``) plus, if its layers differ,
one module in ``layers/``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

LayerKind = Literal["linear", "attention"]
# the token mixer of a model's linear (fixed-state) layers: Gated DeltaNet, LFM2's gated short
# convolution (no recurrent state: the conv tail is the whole state), Mamba2's decay-only SSM,
# MiniMax's Lightning attention (decay-only with a fixed decay per head, no conv), Kimi Delta
# Attention (a delta rule with a per-key-channel decay: dense pairs like GDN), Ring-linear's Lightning
# with RoPE inside (decay-only; the cached state is re-rotated to its segment's offset)
LinearKind = Literal["gdn", "short_conv", "mamba2", "lightning", "kda", "lightning_rope"]


@dataclass(frozen=True)
class MLAShape:
    """Multi-head latent attention's widths (Kimi Linear, Ling 3; ``layers/mla.py``)."""

    q_lora_rank: int  # 0: a plain q_proj
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    head_gate: bool = False  # Ling 3 (``bailing_hybrid``): ``o * sigmoid(g_proj(x))`` per head before ``o_proj``


@dataclass(frozen=True)
class ParallelScales:
    """A layer whose SSM and attention mixers run side by side on one normed input (Falcon-H1), with the
    µP multipliers of each branch.

    Falcon-H1's layer: ``x = norm(h)``; ``y = ssm_out * mamba(ssm_in * x) + attn_out * attn(attn_in * x)``
    (the Mamba2 input projection's output times ``mup`` per section z / x / B / C / dt); ``h + y``; then
    the MLP ``down(up(x) * silu(gate(x) * mlp_gate)) * mlp_down``. The runtime serves it as two
    consecutive layers (``layers/parallel_layer.py``); these numbers are all they need besides the usual shapes.
    """

    attention_in: float = 1.0
    attention_out: float = 1.0
    ssm_in: float = 1.0
    ssm_out: float = 1.0
    ssm_sections: tuple[float, float, float, float, float] = (1.0, 1.0, 1.0, 1.0, 1.0)  # z, x, B, C, dt
    mlp_gate: float = 1.0
    mlp_down: float = 1.0
    # the SSM output's gate: "none" (``y * silu(z)``), "norm_then_gate" (``w * rms_G(y) * silu(z)``) or
    # "gate_then_norm" (``w * rms_G(y * silu(z))``, the Mamba2 default)
    ssm_norm: str = "none"


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
    # layers (``layer_types`` alternates linear / attention; ``layers/parallel_layer``) with these multipliers
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
        V ``(Hkv, D)``; MLA (``layers/mla.py``) its decoupled RoPE key ``(1, rope)`` and its latent
        ``(1, kv_lora_rank)``, expanded to per-head K / V only when attention runs."""
        if self.mla is not None:
            return (1, self.mla.qk_rope_head_dim), (1, self.mla.kv_lora_rank)
        kv = (self.num_key_value_heads, self.head_dim)
        return kv, kv

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("extra", None)
        return d
