"""Tiny configs are valid transformers configs; seeded weights follow the naming contract."""

from __future__ import annotations

import pytest
import torch

from hypic_agent.errors import ModelConfigError
from hypic_agent.runtime.models.families import normalize_config, to_contract
from hypic_agent.runtime.models.hybrid import build_model
from hypic_agent.runtime.models.loading.shapes import expected_shapes, validate_state_dict
from hypic_agent.runtime.models.loading.tokenizer import tiny_tokenizer
from hypic_agent.runtime.models.testing.tiny import (
    TINY_ARCHS,
    TINY_EOS_ID,
    TINY_VOCAB_SIZE,
    build_hf_model,
    canonical_arch,
    hf_config_object,
    random_state_dict,
    tiny_config,
)
from hypic_agent.runtime.runner.standalone import prefill

HF_CLASS = {
    "qwen3_5_text": "Qwen3_5ForCausalLM",
    "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM",
    "qwen3_next": "Qwen3NextForCausalLM",
    "llama": "LlamaForCausalLM",
    "lfm2": "Lfm2ForCausalLM",
    "granitemoehybrid": "GraniteMoeHybridForCausalLM",
    "nemotron_h": "NemotronHForCausalLM",
    "minimax": "MiniMaxForCausalLM",
    "kimi_linear": "KimiLinearForCausalLM",
    "bailing_hybrid": "BailingHybridForCausalLM",
    "falcon_h1": "FalconH1ForCausalLM",
}


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_tiny_config_is_valid_transformers_config(arch: str) -> None:
    d = tiny_config(arch)
    hf = hf_config_object(d)
    assert hf.model_type == arch
    cfg = normalize_config(d)
    assert cfg.vocab_size == TINY_VOCAB_SIZE == len(tiny_tokenizer())
    assert cfg.eos_token_ids == (TINY_EOS_ID,)
    assert cfg.num_layers == 4 and 64 <= cfg.hidden_size <= 128
    if arch not in ("kimi_linear", "bailing_hybrid"):  # MLA: one key / value head per query head
        assert cfg.head_dim == 32 and cfg.num_attention_heads > cfg.num_key_value_heads  # GQA
    if arch == "llama":
        assert cfg.attention_layers == [0, 1, 2, 3] and cfg.rotary_dim == 32
    elif arch == "lfm2":
        assert cfg.attention_layers == [2] and cfg.linear_kind == "short_conv" and cfg.rotary_dim == 32
        assert cfg.linear_conv_dim == cfg.hidden_size and cfg.linear_state_shape == (0, 0, 0)
        assert cfg.intermediate_size == 128  # transformers' Lfm2MLP width rule: 2/3 of 192, rounded to 64
        assert list(hf.layer_types) == ["conv", "conv", "full_attention", "conv"]
    elif arch == "granitemoehybrid":
        assert cfg.attention_layers == [2] and cfg.linear_kind == "mamba2" and cfg.rotary_dim == 0
        assert cfg.linear_state_shape == (4, 16, 32) and cfg.linear_pair_shapes[0] == (4,)  # T: a decay per head
        assert cfg.linear_conv_dim == 2 * 64 + 2 * 2 * 16  # x, B, C
        assert cfg.num_experts == 4 and not cfg.shared_expert_gate and cfg.residual_multiplier == 0.5
    elif arch == "nemotron_h":  # blocks M - M * - M - regrouped into 4 layers, the second without an MLP
        assert cfg.attention_layers == [2] and cfg.linear_kind == "mamba2" and cfg.rotary_dim == 0
        assert cfg.ffn_layers == (True, False, True, True) and cfg.ffn_act == "relu2"
        assert cfg.hf_blocks == ((0, 1), (2, -1), (3, 4), (5, 6)) and len(hf.layers_block_type) == 7
        assert cfg.linear_dt_limit == (0.001, float("inf"))
    elif arch == "minimax":
        assert cfg.attention_layers == [2] and cfg.linear_kind == "lightning" and cfg.rotary_dim == 32
        assert cfg.linear_state_shape == (4, 32, 32) and cfg.linear_conv_dim == 0 and cfg.postnorm_residual
        assert cfg.linear_residual == (0.8, 1.2) and cfg.mlp_residual == (0.95, 1.05)
        assert cfg.num_experts == 4 and cfg.shared_expert_intermediate_size == 0
    elif arch == "kimi_linear":  # MLA: per-head keys 16 + 8 shared, values 16 (padded to 24 in the cache)
        assert cfg.attention_layers == [2] and cfg.linear_kind == "kda" and cfg.rotary_dim == 0
        assert cfg.head_dim == 24 and cfg.num_key_value_heads == 4 and cfg.mla is not None
        assert cfg.linear_state_shape == (4, 16, 16) and cfg.linear_pair_shapes[0] == (4, 16, 16)
        assert cfg.moe_layers == (False, True, True, True) and cfg.router == "sigmoid"
    elif arch == "bailing_hybrid":  # Ling 3: KDA with full-rank gates; MLA with RoPE on the 8 shared key dims
        assert cfg.attention_layers == [2] and cfg.linear_kind == "kda" and cfg.kda_variant == "ling"
        assert cfg.rotary_dim == 8 and cfg.rope_theta == 10000.0 and cfg.mla is not None and cfg.mla.head_gate
        assert cfg.kda_lower_bound == -5.0 and cfg.router_groups == (2, 1) and cfg.linear_state_shape == (4, 16, 16)
    elif arch == "falcon_h1":  # 2 checkpoint layers, each served as a Mamba2 half and an attention half
        assert cfg.layer_types == ("linear", "attention") * 2 and cfg.linear_kind == "mamba2"
        assert cfg.rotary_dim == 32 and cfg.linear_state_shape == (4, 16, 32) and cfg.ffn_layers == (False, True) * 2
        assert cfg.attention_scale == pytest.approx(0.8 * 32**-0.5) and cfg.logits_scaling == 2.0
        assert cfg.parallel is not None and cfg.parallel.ssm_norm == "norm_then_gate"
        assert cfg.parallel.ssm_sections == (0.9, 1.1, 0.8, 1.25, 0.6) and len(hf.layers_block_type) == 2
    else:
        assert cfg.attention_layers == [3] and cfg.linear_layers == [0, 1, 2]
        assert (cfg.linear_num_key_heads, cfg.linear_num_value_heads) == (2, 4)
        assert cfg.rotary_dim == 16  # partial rotary 0.5
        # transformers reads the same layout
        assert list(hf.layer_types) == ["linear_attention"] * 3 + ["full_attention"]
    if arch in ("qwen3_5_moe_text", "qwen3_next"):
        assert cfg.num_experts == 4 and cfg.num_experts_per_tok == 2 and all(cfg.moe_layers)
        assert cfg.shared_expert_intermediate_size > 0
    assert cfg.linear_fused_qkvz == (arch == "qwen3_next")


def test_tiny_config_returns_copies_and_aliases() -> None:
    a = tiny_config("qwen3_5")
    a["hidden_size"] = 1
    assert tiny_config("qwen3_5_text")["hidden_size"] == 64
    assert canonical_arch("qwen3_5_moe") == "qwen3_5_moe_text"
    with pytest.raises(ModelConfigError, match="tiny:qwen3_5_text"):
        tiny_config("mamba")


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_random_state_dict_matches_transformers_names(arch: str) -> None:
    d = tiny_config(arch)
    sd = random_state_dict(d, seed=3)
    model = build_hf_model(d)
    assert type(model).__name__ == HF_CLASS[arch]
    hf_names = set(model.state_dict())
    if d["tie_word_embeddings"]:
        assert "lm_head.weight" not in sd
        hf_names.discard("lm_head.weight")
    assert set(sd) == hf_names
    for k, v in model.state_dict().items():
        if k in sd:
            assert tuple(sd[k].shape) == tuple(v.shape), k
    cfg = normalize_config(d)
    ours = to_contract(cfg, sd)  # renamed for lfm2 / granitemoehybrid, as it is elsewhere
    assert (ours is sd) == (
        cfg.family
        not in ("lfm2", "granitemoehybrid", "nemotron_h", "minimax", "kimi_linear", "bailing_hybrid", "falcon_h1")
    )
    assert {k: tuple(v.shape) for k, v in ours.items()} == expected_shapes(cfg)
    assert validate_state_dict(cfg, ours) == []


@pytest.mark.parametrize("arch", ["qwen3_5_text", "qwen3_next", "llama"])
def test_random_state_dict_is_seeded_and_sane(arch: str) -> None:
    d = tiny_config(arch)
    torch.manual_seed(1234)
    before = torch.rand(3)
    torch.manual_seed(1234)
    a = random_state_dict(d, seed=7)
    after = torch.rand(3)
    assert torch.equal(before, after), "caller's RNG state must be untouched"
    b = random_state_dict(d, seed=7)
    c = random_state_dict(d, seed=8)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])
    for k, t in a.items():
        assert torch.isfinite(t).all(), k
        if k.endswith("A_log"):
            A = t.exp()
            assert (A >= 0.05 - 1e-6).all() and (A <= 1.0 + 1e-6).all()
        if k.endswith("layernorm.weight") or k.endswith("model.norm.weight"):
            centre = 1.0 if arch == "llama" else 0.0
            assert (t - centre).abs().max() < 0.6 and (t - centre).abs().mean() > 0.01, k


def test_random_state_dict_dtype() -> None:
    sd = random_state_dict(tiny_config("qwen3_5_moe_text"), seed=0, dtype=torch.bfloat16)
    assert {t.dtype for t in sd.values()} == {torch.bfloat16}


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_oracle_model_runs_on_shared_weights(arch: str) -> None:
    d = tiny_config(arch)
    sd = random_state_dict(d, seed=0)
    model = build_hf_model(d, sd)
    msd = model.state_dict()
    assert all(torch.equal(msd[k], sd[k]) for k in sd)
    if d["tie_word_embeddings"]:
        assert torch.equal(msd["lm_head.weight"], sd["model.embed_tokens.weight"])
    ids = torch.randint(0, TINY_VOCAB_SIZE, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, 24, TINY_VOCAB_SIZE)
    assert torch.isfinite(logits).all() and logits.std() > 0.05


def test_family_unknown_to_installed_transformers_still_gets_weights(monkeypatch):
    """Ling 3 is newer than some transformers releases (5.17 lacks ``bailing_hybrid``): its tiny weights are
    then drawn on our own module, so ``tiny:bailing_hybrid`` serves under any supported transformers."""
    from hypic_agent.runtime.models.testing import tiny

    cfg = tiny.tiny_config("bailing_hybrid")
    monkeypatch.setattr(tiny, "transformers_has", lambda model_type: False)
    sd = tiny.random_state_dict(cfg, seed=3)
    model = build_model(cfg)
    model.load_weights(sd)  # every parameter named and shaped as the model expects
    logits = prefill(model, [[1, 2, 3, 4]])[0].last_logits
    assert torch.isfinite(logits).all() and logits.std() > 0
    again = tiny.random_state_dict(cfg, seed=3)
    assert torch.equal(sd["model.embed_tokens.weight"], again["model.embed_tokens.weight"])  # seeded
