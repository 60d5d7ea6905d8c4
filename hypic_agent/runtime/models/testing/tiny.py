"""Built-in tiny models: Hugging Face config dicts plus seeded random weights.

The configs are valid transformers configs (``hf_config_object``) so tests can run transformers'
own implementation as the oracle on the very same weights (``build_hf_model``). Weights come from
transformers' model init under ``torch.manual_seed(seed)``, then a few tensors are re-drawn so
that the recurrences and norms are exercised:

* GDN decay: ``A = exp(A_log)`` in [0.05, 1] and ``dt_bias ~ N(0, 0.5)`` give per-token decays
  between ~0.5 and ~0.99, so states carry information over many tokens (transformers' default
  ``A`` up to 16 forgets everything after one token).
* norms: ``N(0, 0.1)`` around the identity (zero-centred Qwen norms ``y * (1 + w)``, plain Llama
  norms ``y * w`` and the gated GDN norm), so a wrong norm convention shows up in outputs.
* causal conv: ``N(0, 1 / sqrt(W))`` instead of ``N(0, 0.02)``.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from hypic_agent.errors import ModelConfigError
from hypic_agent.runtime.models.testing.tiny_bailing import LING_TINY, RING_TINY, own_state_dict
from hypic_agent.runtime.models.testing.tiny_falcon import FALCON_TINY

# vocab of ``loading/tokenizer.tiny_tokenizer()``: 256 byte tokens + <|endoftext|>, <|im_start|>, <|im_end|>
TINY_VOCAB_SIZE = 259
TINY_PAD_ID, TINY_BOS_ID, TINY_EOS_ID = 256, 257, 258

TINY_ARCHS: tuple[str, ...] = (
    "qwen3_5_text", "qwen3_5_moe_text", "qwen3_next", "llama", "lfm2", "granitemoehybrid", "nemotron_h", "minimax",
    "kimi_linear", "bailing_hybrid", "falcon_h1",
)  # fmt: skip
ALIASES: dict[str, str] = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}

_COMMON: dict[str, Any] = {
    "vocab_size": TINY_VOCAB_SIZE,
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "intermediate_size": 128,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 4096,
    "initializer_range": 0.05,
    "attention_bias": False,
    "bos_token_id": None,
    "eos_token_id": TINY_EOS_ID,
    "pad_token_id": TINY_PAD_ID,
}
_LINEAR: dict[str, Any] = {
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
}
_MOE: dict[str, Any] = {
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 64,
}

_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen3_5_text": {"model_type": "qwen3_5_text", **_COMMON, **_LINEAR, "tie_word_embeddings": True},
    "qwen3_5_moe_text": {
        "model_type": "qwen3_5_moe_text",
        **_COMMON,
        **_LINEAR,
        **_MOE,
        "tie_word_embeddings": False,
    },
    "qwen3_next": {
        "model_type": "qwen3_next",
        **_COMMON,
        **_LINEAR,
        **_MOE,
        "decoder_sparse_step": 1,
        "norm_topk_prob": True,
        "mlp_only_layers": [],
        "tie_word_embeddings": False,
    },
    "llama": {
        "model_type": "llama",
        **_COMMON,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "mlp_bias": False,
        "tie_word_embeddings": True,
    },
    # short-conv layers around one attention layer (LFM2's feed-forward width rule: 2/3 of 192,
    # rounded up to 64 -> 128)
    "lfm2": {
        "model_type": "lfm2",
        **_COMMON,
        "intermediate_size": 192,
        "block_multiple_of": 64,
        "layer_types": ["conv", "conv", "full_attention", "conv"],
        "conv_L_cache": 3,
        "norm_eps": 1e-5,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "tie_word_embeddings": True,
    },
    # Granite 4: Mamba2 layers (4 heads x 32, d_state 16, 2 groups) and one attention layer without
    # RoPE; routed MoE plus shared MLP; the Granite multipliers set away from 1
    "granitemoehybrid": {
        "model_type": "granitemoehybrid",
        **_COMMON,
        "intermediate_size": 32,
        "layer_types": ["mamba", "mamba", "attention", "mamba"],
        "mamba_n_heads": 4,
        "mamba_n_groups": 2,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "mamba_chunk_size": 16,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "shared_intermediate_size": 64,
        "position_embedding_type": None,
        "embedding_multiplier": 2.0,
        "residual_multiplier": 0.5,
        "attention_multiplier": 0.125,
        "logits_scaling": 2.0,
        "tie_word_embeddings": False,
    },
    # Nemotron-H: 7 blocks M - M * - M - (mamba, MLP, mamba, attention, MLP, mamba, MLP) = our 4 layers,
    # the second without a feed-forward half; squared-ReLU MLPs, attention without RoPE
    "nemotron_h": {
        "model_type": "nemotron_h",
        **{k: v for k, v in _COMMON.items() if k != "num_hidden_layers"},
        "hybrid_override_pattern": "M-M*-M-",
        "mamba_num_heads": 4,
        "mamba_head_dim": 32,
        "n_groups": 2,
        "ssm_state_size": 16,
        "conv_kernel": 4,
        "chunk_size": 16,
        "layer_norm_epsilon": 1e-5,
        "tie_word_embeddings": False,
    },
    # MiniMax: Lightning layers around one RoPE attention layer, 4 routed experts, the post-norm
    # residual factors set away from 1 (16-token blocks in transformers' chunked Lightning)
    "minimax": {
        "model_type": "minimax",
        **_COMMON,
        "intermediate_size": 32,
        "layer_types": ["linear_attention", "linear_attention", "full_attention", "linear_attention"],
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "block_size": 16,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "linear_attn_alpha_factor": 0.8,
        "linear_attn_beta_factor": 1.2,
        "full_attn_alpha_factor": 0.9,
        "full_attn_beta_factor": 1.1,
        "mlp_alpha_factor": 0.95,
        "mlp_beta_factor": 1.05,
        "tie_word_embeddings": False,
    },
    # Kimi Linear: KDA layers (4 heads x 16, per-channel decay) around one MLA layer (NoPE, keys 24 =
    # 16 + 8 shared, values 16), a dense first layer then sigmoid-routed MoE with a shared expert
    "kimi_linear": {
        "model_type": "kimi_linear",
        **{k: v for k, v in _COMMON.items() if k not in ("head_dim", "num_key_value_heads")},
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "intermediate_size": 128,
        "moe_intermediate_size": 32,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
        "routed_scaling_factor": 2.0,
        "first_k_dense_replace": 1,
        "kv_lora_rank": 32,
        "q_lora_rank": None,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        "linear_attn_config": {
            "num_heads": 4,
            "head_dim": 16,
            "short_conv_kernel_size": 4,
            "kda_layers": [1, 2, 4],
            "full_attn_layers": [3],
        },
        "tie_word_embeddings": False,
    },
    "bailing_hybrid": {
        "model_type": "bailing_hybrid",
        **{k: v for k, v in _COMMON.items() if k not in ("head_dim", "num_key_value_heads")},
        **LING_TINY,
    },
    # Falcon-H1: Mamba2 and attention in parallel in each of 2 checkpoint layers (``tiny_falcon``)
    "falcon_h1": {"model_type": "falcon_h1", **_COMMON, **FALCON_TINY},
}


# families transformers lacks: seeded weights on our own module, no oracle (``tiny_bailing``)
_CONFIGS["bailing_moe_linear"] = {
    **RING_TINY,
    "vocab_size": TINY_VOCAB_SIZE,
    "bos_token_id": None,
    "eos_token_id": TINY_EOS_ID,
    "pad_token_id": TINY_PAD_ID,
}
OWN_INIT: tuple[str, ...] = ("bailing_moe_linear",)


def canonical_arch(arch: str) -> str:
    """``"qwen3_5"`` -> ``"qwen3_5_text"`` etc.; raises ``ModelConfigError`` for unknown names."""
    arch = ALIASES.get(arch, arch)
    if arch not in _CONFIGS:
        raise ModelConfigError(
            f"no tiny config for {arch!r}; use one of {[*TINY_ARCHS, *OWN_INIT]} (e.g. 'tiny:qwen3_5_text')",
            param="model",
        )
    return arch


def tiny_config(arch: str) -> dict[str, Any]:
    """A fresh copy of the tiny HF config dict for ``arch`` (see ``TINY_ARCHS``)."""
    return copy.deepcopy(_CONFIGS[canonical_arch(arch)])


def transformers_has(model_type: str) -> bool:
    """Whether the installed transformers knows ``model_type`` (newer families need a newer release)."""
    from transformers import CONFIG_MAPPING

    return model_type in CONFIG_MAPPING


def hf_config_object(hf_config: dict[str, Any]) -> Any:
    """The transformers ``PreTrainedConfig`` for a config dict (wrapper configs included)."""
    from transformers import AutoConfig

    d = dict(hf_config)
    model_type = d.pop("model_type")
    return AutoConfig.for_model(model_type, **d)


def build_hf_model(
    hf_config: dict[str, Any],
    state_dict: dict[str, torch.Tensor] | None = None,
    *,
    dtype: torch.dtype = torch.float32,
) -> Any:
    """transformers' ``*ForCausalLM`` for ``hf_config`` in eval mode (the oracle).

    With ``state_dict`` (our naming contract == transformers' names) the weights are loaded
    strictly; without, the model keeps transformers' init under the current RNG state.
    """
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(hf_config_object(hf_config))
    if state_dict is not None:
        sd = dict(state_dict)
        if model.config.tie_word_embeddings:
            sd.setdefault("lm_head.weight", sd["model.embed_tokens.weight"])
        model.load_state_dict(sd, strict=True)
    return model.to(dtype).eval()


def random_state_dict(
    hf_config: dict[str, Any], seed: int = 0, dtype: torch.dtype = torch.float32
) -> dict[str, torch.Tensor]:
    """Seeded random weights under the naming contract (``lm_head.weight`` absent when tied).

    Deterministic in ``(hf_config, seed)``; the caller's global RNG state is left untouched.
    """
    if hf_config.get("model_type") in OWN_INIT or not transformers_has(str(hf_config.get("model_type"))):
        return own_state_dict(hf_config, seed, dtype)  # e.g. Ling 3 under transformers < 5.2x
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build_hf_model(hf_config)
    gen = torch.Generator().manual_seed(seed + 1)
    zero_centered = str(hf_config.get("model_type")).startswith("qwen")
    out: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        t = t.detach().clone().float()
        if name.endswith(("linear_attn.A_log", "mamba.A_log", "mixer.A_log", "forget_gate.A_log")):
            t = torch.empty(t.shape).uniform_(0.05, 1.0, generator=gen).log()
        elif name.endswith(
            ("_attn.dt_bias", "mamba.dt_bias", "mixer.dt_bias", "gate.dt_bias", "mamba.D", "mixer.D", "conv1d.bias")
        ):
            t = torch.randn(t.shape, generator=gen) * 0.5
        elif name.endswith(("conv1d.weight", "conv.conv.weight")):
            t = torch.randn(t.shape, generator=gen) / t.shape[-1] ** 0.5
        elif name.endswith(("linear_attn.norm.weight", "mamba.norm.weight", "mixer.norm.weight", "o_norm.weight")):
            t = 1.0 + 0.1 * torch.randn(t.shape, generator=gen)  # gated norms: y * w
        elif name.endswith("e_score_correction_bias"):
            t = 0.1 * torch.randn(t.shape, generator=gen)
        elif name.endswith("norm.weight"):
            t = 0.1 * torch.randn(t.shape, generator=gen) + (0.0 if zero_centered else 1.0)
        out[name] = t.to(dtype).contiguous()
    if model.config.tie_word_embeddings:
        out.pop("lm_head.weight", None)
    return out
