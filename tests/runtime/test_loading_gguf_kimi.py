"""GGUF loading of Kimi Linear: the tiny model written as llama.cpp's ``KimiLinearModel`` converter lays
it out (per-layer ``head_count_kv`` marking the MLA layers, split q/k/v convs, ``-exp(A_log)``, MLA's
``kv_b_proj`` split into a transposed ``attn_k_b`` and ``attn_v_b``, stacked experts), loaded with
``load_gguf``: config, tensors and logits equal the model from transformers' weights."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hypic_agent.errors import ModelConfigError
from hypic_agent.runtime.models.families import normalize_config
from hypic_agent.runtime.models.hybrid import build_model
from hypic_agent.runtime.models.loading.gguf import load_gguf

from .conftest import finish_gguf, make_model, rand_tokens
from .test_loading_gguf_families import _logits, _tokenizer, assert_same_model

gguf = pytest.importorskip("gguf")


def _tensors(d: dict[str, Any], sd: dict[str, torch.Tensor]) -> list[tuple[str, np.ndarray]]:
    """``KimiLinearModel.modify_tensors`` (from transformers' names; the hub's differ only in naming)."""
    n = d["num_hidden_layers"]
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.KIMI_LINEAR, n)
    fmt, t = gguf.TENSOR_NAMES, gguf.MODEL_TENSOR
    heads, nope, vd = d["num_attention_heads"], d["qk_nope_head_dim"], d["v_head_dim"]
    out: list[tuple[str, np.ndarray]] = []
    for k, tv in sd.items():
        v = tv.numpy().astype(np.float32).copy()
        bid = int(k.split(".")[2]) if ".layers." in k else -1
        name = lambda kind: fmt[kind].format(bid=bid) + ".weight"  # noqa: E731
        if k.endswith("self_attn.conv1d.weight"):
            for kind, part in zip((t.SSM_CONV1D_Q, t.SSM_CONV1D_K, t.SSM_CONV1D_V), np.split(v, 3)):
                out.append((name(kind), part.reshape(1, part.shape[0], 1, part.shape[-1])))
            continue
        if k.endswith("kv_b_proj.weight"):
            kv_b = v.reshape(heads, nope + vd, -1)
            out += [(name(t.ATTN_K_B), kv_b[:, :nope].swapaxes(1, 2)), (name(t.ATTN_V_B), kv_b[:, nope:])]
            continue
        if k.endswith("mlp.experts.gate_up_proj"):
            half = v.shape[-2] // 2
            out += [(name(t.FFN_GATE_EXP), v[..., :half, :]), (name(t.FFN_UP_EXP), v[..., half:, :])]
            continue
        if k.endswith("mlp.experts.down_proj"):
            out.append((name(t.FFN_DOWN_EXP), v))
            continue
        if k.endswith("e_score_correction_bias"):
            out.append((fmt[t.FFN_EXP_PROBS_B].format(bid=bid) + ".bias", v))
            continue
        hub = k.replace(".forget_gate.", ".").replace(".dt_bias", ".dt_proj.bias")
        if hub.endswith(".A_log"):
            v = -np.exp(v)
        g = names.get_name(hub, try_suffixes=(".weight", ".bias"))
        assert g is not None, k
        out.append((g, v))
    return [(g, np.ascontiguousarray(v)) for g, v in out]


def write_kimi_gguf(
    path: Path, *, q8: bool = False, gating: int | None = None, **overrides: Any
) -> tuple[Any, dict[str, Any]]:
    model, sd, d = make_model("kimi_linear", **overrides)
    n, lin = d["num_hidden_layers"], d["linear_attn_config"]
    rank, rope = d["kv_lora_rank"], d["qk_rope_head_dim"]
    w = gguf.GGUFWriter(str(path), "kimi-linear")
    w.add_name("tiny-kimi-linear")
    w.add_block_count(n)  # TextModel.set_gguf_parameters
    w.add_context_length(d["max_position_embeddings"])
    w.add_embedding_length(d["hidden_size"])
    w.add_feed_forward_length(d["intermediate_size"])
    w.add_head_count(d["num_attention_heads"])
    w.add_layer_norm_rms_eps(d["rms_norm_eps"])
    w.add_expert_count(d["num_local_experts"])
    w.add_expert_used_count(d["num_experts_per_tok"])
    w.add_vocab_size(d["vocab_size"])  # KimiLinearModel.set_gguf_parameters
    w.add_head_count_kv([1 if i + 1 in lin["full_attn_layers"] else 0 for i in range(n)])
    w.add_ssm_conv_kernel(lin["short_conv_kernel_size"])
    w.add_kda_head_dim(lin["head_dim"])
    w.add_kv_lora_rank(rank)
    w.add_rope_dimension_count(rope)
    w.add_key_length(rank + rope)
    w.add_key_length_mla(d["qk_nope_head_dim"] + rope)
    w.add_value_length_mla(d["v_head_dim"])
    w.add_expert_feed_forward_length(d["moe_intermediate_size"])
    w.add_expert_shared_count(d["n_shared_experts"])
    w.add_leading_dense_block_count(d["first_k_dense_replace"])
    w.add_expert_weights_scale(d["routed_scaling_factor"])
    if gating is not None:
        w.add_expert_gating_func(gguf.ExpertGatingFuncType(gating))
    _tokenizer(w)
    finish_gguf(w, _tensors(d, sd), q8)
    return model, d


def test_kimi_linear_gguf_roundtrip_matches_hf_weights(tmp_path: Path) -> None:
    path = tmp_path / "kimi.gguf"
    ref, d = write_kimi_gguf(path)
    cfg, raw, tensors = load_gguf(path)
    want = normalize_config(d)
    assert raw["model_type"] == "kimi_linear"
    assert replace(cfg, max_position_embeddings=want.max_position_embeddings) == want
    assert cfg.layer_types == ("linear", "linear", "attention", "linear")
    expected = {k: v.float() for k, v in ref.state_dict().items()}
    assert_same_model(cfg, tensors, expected, ref, ("A_log",))  # log(-(-exp(a))): not bit-exact


def test_kimi_linear_gguf_q8_0_tensors_within_the_q8_0_bound(tmp_path: Path) -> None:
    """Q8_0 projections: every quantized tensor, after our joins (``kv_b_proj`` from the transposed
    ``attn_k_b``, the experts), within Q8_0's rounding bound of the F32 one. (Logits are not bounded:
    the tiny model routes top-2 of 4 experts and a rounding can flip a choice.)"""
    write_kimi_gguf(tmp_path / "f32.gguf")
    write_kimi_gguf(tmp_path / "q8.gguf", q8=True)
    _, _, exact = load_gguf(tmp_path / "f32.gguf")
    _, _, tensors = load_gguf(tmp_path / "q8.gguf")
    moved = 0
    for k, v in exact.items():
        step = v.abs().max().item() / 127
        assert (tensors[k] - v).abs().max().item() <= 0.6 * step + 1e-7, k  # + the fp16 scale's rounding
        moved += int(not torch.equal(tensors[k], v))
    assert moved >= 10 and not torch.equal(
        tensors["model.layers.2.self_attn.kv_b_proj.weight"], exact["model.layers.2.self_attn.kv_b_proj.weight"]
    )


def test_kimi_linear_gguf_q8_0_close_to_hf_weights(tmp_path: Path) -> None:
    """Q8_0 logits, routing to all 4 experts (no top-k flip). Like the tiny GDN models, the tiny KDA
    model amplifies weight rounding more than the Mamba2 / conv ones (~3.5% of the logit range
    measured), so the bound is 10% of the range, not 2%; the tensor-level test above is the tight one."""
    ref, _ = write_kimi_gguf(tmp_path / "q8.gguf", q8=True, num_experts_per_tok=4)
    cfg, _, tensors = load_gguf(tmp_path / "q8.gguf")
    model = build_model(cfg)
    model.load_weights(tensors)
    ids = rand_tokens(40, seed=12)
    want, got = _logits(ref, ids), _logits(model, ids)
    err = (got - want).abs().max().item()
    assert 0 < err <= 0.1 * (want.max() - want.min()).item()


def test_kimi_linear_gguf_with_softmax_routing_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "kimi-softmax.gguf"
    write_kimi_gguf(path, gating=1)
    with pytest.raises(ModelConfigError, match="sigmoid"):
        load_gguf(path)
