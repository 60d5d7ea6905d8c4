"""Config normalizers of LFM2, Granite 4 and Nemotron-H on hub-shaped config.json values."""

from __future__ import annotations

import pytest

from hypic_agent.errors import ModelConfigError
from hypic_agent.runtime.models.families import normalize_config

_ATT = {"vocab_size": 100, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2}


def test_lfm2_feed_forward_width_and_layer_layout():
    # LFM2-1.2B's config.json: block_ff_dim 12288 -> transformers' Lfm2MLP width 8192
    cfg = normalize_config(
        {**_ATT, "model_type": "lfm2", "num_hidden_layers": 4, "block_ff_dim": 12288, "full_attn_idxs": [1, 3],
         "conv_L_cache": 3, "tie_embedding": True}
    )  # fmt: skip
    assert cfg.intermediate_size == 8192
    assert cfg.layer_types == ("linear", "attention", "linear", "attention")
    assert cfg.linear_kind == "short_conv" and cfg.linear_conv_kernel_dim == 3 and cfg.tie_word_embeddings
    assert cfg.rope_theta == 1000000.0  # Lfm2Config's default


def test_granite_mamba_head_dim_auto_and_nope():
    cfg = normalize_config(
        {**_ATT, "model_type": "granitemoehybrid", "num_hidden_layers": 3,
         "layer_types": ["mamba", "attention", "mamba"], "mamba_n_heads": 8, "mamba_d_head": "auto",
         "mamba_expand": 2, "mamba_d_state": 32, "mamba_n_groups": 1,
         "num_local_experts": 0, "shared_intermediate_size": 96, "position_embedding_type": "nope"}
    )  # fmt: skip
    assert cfg.linear_state_shape == (8, 32, 16)  # heads, d_state, 2 * 64 / 8
    assert cfg.rotary_dim == 0 and cfg.num_experts == 0 and cfg.intermediate_size == 96
    with pytest.raises(ModelConfigError, match="mamba_d_head"):
        normalize_config(
            {**_ATT, "model_type": "granitemoehybrid", "num_hidden_layers": 1, "mamba_n_heads": 8, "mamba_d_head": 10}
        )


@pytest.mark.parametrize(
    ("pattern", "kinds", "ffn"),
    [
        ("M-M-M*-", ("linear", "linear", "linear", "attention"), (True, True, False, True)),
        ("MM*", ("linear", "linear", "attention"), (False, False, False)),
    ],
)
def test_nemotron_blocks_regroup_into_layers(pattern, kinds, ffn):
    cfg = normalize_config({**_ATT, "model_type": "nemotron_h", "hybrid_override_pattern": pattern})
    assert cfg.layer_types == kinds and cfg.ffn_layers == ffn
    assert sum(1 + (b >= 0) for _, b in cfg.hf_blocks) == len(pattern)


@pytest.mark.parametrize(("pattern", "match"), [("-M", "must follow"), ("M--", "must follow"), ("ME", "MoE")])
def test_nemotron_unsupported_block_layouts(pattern, match):
    with pytest.raises(ModelConfigError, match=match):
        normalize_config({**_ATT, "model_type": "nemotron_h", "hybrid_override_pattern": pattern})


def test_minimax_defaults_and_refusals():
    cfg = normalize_config({**_ATT, "model_type": "minimax", "num_hidden_layers": 4, "intermediate_size": 32})
    # transformers' default layout: even layers full attention, odd ones Lightning
    assert cfg.layer_types == ("attention", "linear", "attention", "linear")
    assert cfg.linear_kind == "lightning" and cfg.postnorm_residual and cfg.rope_theta == 1000000.0
    assert cfg.rotary_dim == cfg.head_dim == 16
    with pytest.raises(ModelConfigError, match="sliding_window"):
        normalize_config({**_ATT, "model_type": "minimax", "num_hidden_layers": 2, "intermediate_size": 8,
                              "sliding_window": 64})  # fmt: skip


def test_kimi_linear_hub_config_names():
    """The hub config.json of Kimi Linear names its fields differently from transformers' class."""
    cfg = normalize_config(
        {"model_type": "kimi_linear", "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 4,
         "num_attention_heads": 4, "model_max_length": 8192, "num_experts": 8, "num_experts_per_token": 2,
         "num_shared_experts": 2, "moe_intermediate_size": 16, "num_expert_group": 2, "topk_group": 1,
         "moe_renormalize": False, "first_k_dense_replace": 2, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
         "qk_rope_head_dim": 8, "v_head_dim": 16,
         "linear_attn_config": {"num_heads": 2, "head_dim": 8, "short_conv_kernel_size": 4,
                                "kda_layers": [1, 2, 3], "full_attn_layers": [4]}}
    )  # fmt: skip
    assert cfg.layer_types == ("linear", "linear", "linear", "attention") and cfg.linear_kind == "kda"
    assert cfg.max_position_embeddings == 8192 and cfg.num_experts == 8 and cfg.num_experts_per_tok == 2
    assert cfg.shared_expert_intermediate_size == 32 and cfg.router_groups == (2, 1) and not cfg.norm_topk_prob
    assert cfg.moe_layers == (False, False, True, True) and cfg.head_dim == 24 and cfg.rotary_dim == 0


def test_bailing_hybrid_hub_config_names_and_defaults():
    """Ling 3's hub config.json (transformers' attribute_map names; ``head_dim`` is the KDA head width,
    which transformers' class overwrites with ``qk_rope_head_dim``, so ``linear_head_dim`` wins when saved)."""
    base = {"model_type": "bailing_hybrid", "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 6,
            "num_attention_heads": 4, "model_max_length": 8192, "num_experts": 8, "num_experts_per_token": 2,
            "num_shared_experts": 1, "moe_intermediate_size": 16, "num_expert_group": 2, "topk_group": 1,
            "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
            "head_dim": 32}  # fmt: skip
    cfg = normalize_config(base)
    assert cfg.layer_types == ("linear",) * 5 + ("attention",)  # layer_group_size 6
    assert cfg.moe_layers == (False, False, True, True, True, True)  # first_k_dense_replace 2
    assert cfg.linear_state_shape == (4, 32, 32) and cfg.kda_variant == "ling" and cfg.kda_lower_bound == -5.0
    assert cfg.rotary_dim == 8 and cfg.rope_theta == 6_000_000.0 and cfg.max_position_embeddings == 8192
    assert cfg.num_experts == 8 and cfg.router == "sigmoid" and cfg.router_groups == (2, 1)
    saved = normalize_config({**base, "head_dim": 8, "linear_head_dim": 32, "kda_safe_gate": False})
    assert saved.linear_state_shape == (4, 32, 32) and saved.kda_lower_bound is None
