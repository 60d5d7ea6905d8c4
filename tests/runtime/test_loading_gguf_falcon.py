"""GGUF loading of Falcon-H1: the tiny model written as llama.cpp's ``FalconH1Model`` converter lays it
out (µP multipliers folded into the weights, Mamba2 tensor conventions, checkpoint layer names),
loaded with ``load_gguf``: its logits must equal those of the same model from transformers' weights
with every multiplier in the config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hypic_agent.runtime.models.hybrid import build_model
from hypic_agent.runtime.models.loading.gguf import load_gguf, supported_archs

from .conftest import finish_gguf, make_model, rand_tokens
from .test_loading_gguf_families import _logits, _tokenizer

gguf = pytest.importorskip("gguf")

# llama.cpp's Mamba2 graph gates then norms; a GGUF cannot say otherwise (see gguf_falcon)
GATE_THEN_NORM = {"mamba_norm_before_gate": False}


def _fold(k: str, v: np.ndarray, d: dict[str, Any]) -> np.ndarray:
    """``FalconH1Model.modify_tensors``: each multiplier into the weight it scales."""
    mlp, ssm = d["mlp_multipliers"], d["ssm_multipliers"]
    if "down_proj" in k:
        return v * mlp[1]
    if "gate_proj" in k:
        return v * mlp[0]
    if "k_proj" in k:
        return v * d["key_multiplier"] * d["attention_in_multiplier"]
    if "q_proj" in k or "v_proj" in k:
        return v * d["attention_in_multiplier"]
    if "o_proj" in k:
        return v * d["attention_out_multiplier"]
    if "out_proj" in k:
        return v * d["ssm_out_multiplier"]
    if "in_proj" in k:
        v = v * d["ssm_in_multiplier"]
        inner, gs = d["mamba_d_ssm"], d["mamba_n_groups"] * d["mamba_d_state"]
        bounds = [0, inner, 2 * inner, 2 * inner + gs, 2 * inner + 2 * gs, v.shape[0]]
        for m, lo, hi in zip(ssm, bounds, bounds[1:]):
            v[lo:hi] *= m
        return v
    if "lm_head" in k:
        return v * d["lm_head_multiplier"]
    if "embed_tokens" in k:
        return v * d["embedding_multiplier"]
    return v


def write_falcon_gguf(path: Path, *, q8: bool = False, **overrides: Any) -> tuple[Any, dict[str, Any]]:
    """The tiny Falcon-H1 as a GGUF; returns (our model from transformers' weights, HF config)."""
    model, sd, d = make_model("falcon_h1", **{**GATE_THEN_NORM, **overrides})
    n = d["num_hidden_layers"]
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.FALCON_H1, n)
    w = gguf.GGUFWriter(str(path), "falcon-h1")
    w.add_name("tiny-falcon-h1")
    # Mamba2Model.set_gguf_parameters, then FalconH1Model's overrides
    w.add_context_length(2**20)
    w.add_embedding_length(d["hidden_size"])
    w.add_feed_forward_length(0)
    w.add_head_count(0)
    w.add_block_count(n)
    w.add_ssm_conv_kernel(d["mamba_d_conv"])
    w.add_ssm_inner_size(d["mamba_d_ssm"])
    w.add_ssm_state_size(d["mamba_d_state"])
    w.add_ssm_time_step_rank(d["mamba_d_ssm"] // d["mamba_d_head"])
    w.add_ssm_group_count(d["mamba_n_groups"])
    w.add_layer_norm_rms_eps(d["rms_norm_eps"])
    w.add_vocab_size(d["vocab_size"])
    w.add_context_length(d["max_position_embeddings"])
    w.add_feed_forward_length(d["intermediate_size"])
    w.add_head_count(d["num_attention_heads"])
    w.add_head_count_kv(d["num_key_value_heads"])
    w.add_key_length(d["head_dim"])
    w.add_value_length(d["head_dim"])
    w.add_rope_freq_base(d["rope_parameters"]["rope_theta"])
    _tokenizer(w)
    out = []
    for k, t in sd.items():
        v = _fold(k, t.numpy().astype(np.float32).copy(), d)
        hub = k[: -len("dt_bias")] + "dt_proj.bias" if k.endswith(".dt_bias") else k
        g = names.get_name(hub, try_suffixes=(".weight", ".bias"))
        assert g is not None, k
        if g.endswith(".ssm_conv1d.weight"):
            v = v.squeeze(1)
        elif g.endswith((".ssm_a", ".ssm_d")):
            v = v.reshape(*v.shape, 1)
        elif g.endswith(".ssm_norm.weight"):
            v = v.reshape(d["mamba_n_groups"], -1)
        if g.endswith(".ssm_a"):
            v = -np.exp(v)
        out.append((g, np.ascontiguousarray(v)))
    finish_gguf(w, out, q8, keep_float=("conv", "ssm_norm"))
    return model, d


@pytest.mark.parametrize("rms_norm", [True, False], ids=["grouped-norm", "no-norm"])
def test_falcon_h1_gguf_matches_hf_weights(tmp_path: Path, rms_norm: bool) -> None:
    """Folded multipliers, no stored ones: the config has them all at 1 and the logits are the HF
    model's (whose multipliers are all away from 1, so dropping or double-applying one shows). With
    and without the Mamba2 grouped norm (released Falcon-H1 checkpoints differ)."""
    path = tmp_path / "falcon.gguf"
    ref, d = write_falcon_gguf(path, mamba_rms_norm=rms_norm)
    cfg, raw, tensors = load_gguf(path)
    assert raw["model_type"] == "falcon_h1" and cfg.family == "falcon_h1"
    assert cfg.num_layers == 2 * d["num_hidden_layers"] and cfg.linear_kind == "mamba2"
    assert cfg.embedding_multiplier == 1.0 and cfg.logits_scaling == 1.0 and cfg.attention_scale == 32**-0.5
    assert cfg.parallel is not None and cfg.parallel.ssm_sections == (1.0,) * 5
    assert cfg.parallel.ssm_norm == ("gate_then_norm" if rms_norm else "none")
    # folded: embeddings x 2, attention-half layer 1's k_proj x 0.8 x 1.1
    sd = ref.state_dict()
    assert torch.allclose(tensors["model.embed_tokens.weight"], 2.0 * sd["model.embed_tokens.weight"])
    assert torch.allclose(
        tensors["model.layers.1.self_attn.k_proj.weight"], 0.88 * sd["model.layers.1.self_attn.k_proj.weight"]
    )
    assert torch.allclose(
        tensors["model.layers.0.linear_attn.A_log"], sd["model.layers.0.linear_attn.A_log"], atol=1e-6
    )
    model = build_model(cfg)
    model.load_weights(tensors)
    ids = rand_tokens(40, seed=11)
    want, got = _logits(ref, ids), _logits(model, ids)
    assert (got - want).abs().max().item() <= 1e-5
    assert (want.max() - want.min()).item() > 1.0  # the comparison is not between two near-zero outputs


def test_falcon_h1_gguf_q8_0_close_to_hf_weights(tmp_path: Path) -> None:
    path = tmp_path / "falcon-q8.gguf"
    ref, _ = write_falcon_gguf(path, q8=True)
    cfg, _, tensors = load_gguf(path)
    model = build_model(cfg)
    model.load_weights(tensors)
    ids = rand_tokens(40, seed=12)
    want, got = _logits(ref, ids), _logits(model, ids)
    err = (got - want).abs().max().item()
    assert 0 < err <= 0.02 * (want.max() - want.min()).item()


def test_falcon_h1_is_a_supported_arch() -> None:
    assert "falcon-h1" in supported_archs()


def test_new_family_ggufs_serve_as_model_sources(tmp_path: Path) -> None:
    """What ``serve --model x.gguf`` does, for the families added with Falcon-H1, Qwen3.5 and Kimi
    Linear: resolve, load weights (the family's fingerprint), read the embedded tokenizer."""
    from hypic_agent.config import Settings
    from hypic_agent.runtime.models.loading.catalog import resolve_model
    from hypic_agent.runtime.models.loading.tokenizer import load_tokenizer
    from hypic_agent.runtime.models.loading.weights import load_weights

    from .test_loading_gguf_kimi import write_kimi_gguf
    from .test_loading_gguf_qwen import write_qwen_gguf

    writers = {
        "falcon_h1": lambda p: write_falcon_gguf(p),
        "qwen3_5_text": lambda p: write_qwen_gguf(p, "qwen3_5_text"),
        "kimi_linear": lambda p: write_kimi_gguf(p),
    }
    for family, write in writers.items():
        path = tmp_path / f"{family}.gguf"
        write(path)
        source = resolve_model(str(path), Settings(), fetch=False)
        assert source.kind == "gguf"
        loaded = load_weights(source)
        assert loaded.config.model_type == family and loaded.fingerprint.startswith(f"{family}:float32:"), family
        tok = load_tokenizer(source)
        assert tok("a   b", add_special_tokens=False)["input_ids"] == [97, 256, 32, 98] and tok.eos_token_id == 258
