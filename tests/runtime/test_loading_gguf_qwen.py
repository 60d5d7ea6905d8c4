"""GGUF loading of the Gated DeltaNet hybrids (``qwen3next``, ``qwen35``, ``qwen35moe``): the tiny
models written as llama.cpp's ``Qwen3NextModel`` / ``Qwen3_5TextModel`` / ``Qwen3_5MoeTextModel``
converters lay them out (``1 + w`` norms, ``-exp(A_log)``, squeezed conv, Qwen3-Next's ``in_proj_qkvz``
split into ``attn_qkv`` + ``attn_gate``, Qwen3.5's value heads reordered to tiled order, stacked
experts), loaded with ``load_gguf``: tensors and logits equal the model from transformers' weights."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hypic_agent.runtime.models.families import normalize_config
from hypic_agent.runtime.models.hybrid import build_model
from hypic_agent.runtime.models.loading.gguf import load_gguf, supported_archs

from .conftest import finish_gguf, make_model, rand_tokens
from .test_loading_gguf_families import _logits, _tokenizer, assert_same_model

gguf = pytest.importorskip("gguf")

ARCH = {"qwen3_next": "QWEN3NEXT", "qwen3_5_text": "QWEN35", "qwen3_5_moe_text": "QWEN35MOE"}


def _tiled(w: np.ndarray, axis: int, k: int, per_k: int, hd: int) -> np.ndarray:
    """``_LinearAttentionVReorderBase._reorder_v_heads``: grouped by key head -> tiled."""
    w = np.moveaxis(w, axis, 0)
    shape = w.shape
    w = w.reshape(k, per_k, hd, *shape[1:]).swapaxes(0, 1).reshape(shape)
    return np.ascontiguousarray(np.moveaxis(w, 0, axis))


def _reorder_v(k: str, v: np.ndarray, d: dict[str, Any]) -> np.ndarray:
    nk, nv, dk, dv = (d[f"linear_{x}"] for x in ("num_key_heads", "num_value_heads", "key_head_dim", "value_head_dim"))
    if nk == nv or "linear_attn." not in k:
        return v
    r, qk = nv // nk, 2 * nk * dk
    if ".in_proj_qkv." in k:
        return np.concatenate([v[:qk], _tiled(v[qk:], 0, nk, r, dv)])
    if ".in_proj_z." in k:
        return _tiled(v, 0, nk, r, dv)
    if ".in_proj_b." in k or ".in_proj_a." in k or ".A_log" in k or ".dt_bias" in k:
        return _tiled(v, 0, nk, r, 1)
    if ".conv1d" in k:
        v = v.squeeze(1)
        return np.concatenate([v[:qk], _tiled(v[qk:], 0, nk, r, dv)])
    if ".out_proj." in k:
        return _tiled(v, 1, nk, r, dv)
    return v


def _split_qkvz(v: np.ndarray, d: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """``Qwen3NextModel.modify_tensors``: per key head [q, k, v, z] -> (all q | all k | all v, all z)."""
    nk, dk = d["linear_num_key_heads"], d["linear_key_head_dim"]
    dvk = d["linear_num_value_heads"] // nk * d["linear_value_head_dim"]
    g = v.reshape(nk, 2 * dk + 2 * dvk, -1)
    q, kk, vv, z = np.split(g, [dk, 2 * dk, 2 * dk + dvk], axis=1)
    cols = v.shape[-1]
    return np.concatenate([x.reshape(-1, cols) for x in (q, kk, vv)]), z.reshape(-1, cols)


def _tensors(arch: str, d: dict[str, Any], sd: dict[str, torch.Tensor]) -> list[tuple[str, np.ndarray]]:
    n = d["num_hidden_layers"]
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[ARCH[arch]], n)
    fmt, t = gguf.TENSOR_NAMES, gguf.MODEL_TENSOR
    out: list[tuple[str, np.ndarray]] = []
    for k, tv in sd.items():
        v = tv.numpy().astype(np.float32).copy()
        bid = int(k.split(".")[2]) if ".layers." in k else -1
        if arch != "qwen3_next":
            v = _reorder_v(k, v, d)
        if k.endswith(".A_log"):
            v = -np.exp(v)
        elif k.endswith(".dt_bias"):
            k = k[: -len("dt_bias")] + "dt_proj.bias"
        elif "conv1d" in k:
            v = v.reshape(v.shape[0], -1)
        elif k.endswith("norm.weight") and not k.endswith("linear_attn.norm.weight"):
            v = v + 1
        if k.endswith("in_proj_qkvz.weight"):
            qkv, z = _split_qkvz(v, d)
            out += [
                (fmt[t.ATTN_QKV].format(bid=bid) + ".weight", qkv),
                (fmt[t.ATTN_GATE].format(bid=bid) + ".weight", z),
            ]
            continue
        if k.endswith("mlp.experts.gate_up_proj"):  # Qwen2MoeModel: split on dim -2
            half = v.shape[-2] // 2
            out += [(fmt[t.FFN_GATE_EXP].format(bid=bid) + ".weight", v[..., :half, :])]
            out += [(fmt[t.FFN_UP_EXP].format(bid=bid) + ".weight", v[..., half:, :])]
            continue
        if k.endswith("mlp.experts.down_proj"):
            k += ".weight"
        g = names.get_name(k, try_suffixes=(".weight", ".bias"))
        assert g is not None, k
        out.append((g, v))
    return [(g, np.ascontiguousarray(v)) for g, v in out]


def write_qwen_gguf(
    path: Path, arch: str, *, q8: bool = False, mtp: bool = False, **overrides: Any
) -> tuple[Any, dict[str, Any]]:
    """The tiny ``arch`` as the converter writes it; returns (our model from transformers' weights, HF config).
    ``mtp``: with one multi-token-prediction block appended, as ``_Qwen35MtpMixin`` writes it."""
    model, sd, d = make_model(arch, **overrides)
    hd, rope, n = d["head_dim"], d["rope_parameters"], d["num_hidden_layers"]
    w = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH[ARCH[arch]]])
    w.add_name(f"tiny-{arch}")
    w.add_block_count(n + int(mtp))  # TextModel.set_gguf_parameters
    w.add_context_length(d["max_position_embeddings"])
    w.add_embedding_length(d["hidden_size"])
    w.add_feed_forward_length(d["intermediate_size"])
    w.add_head_count(d["num_attention_heads"])
    w.add_head_count_kv(d["num_key_value_heads"])
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_layer_norm_rms_eps(d["rms_norm_eps"])
    w.add_key_length(hd)
    w.add_value_length(hd)
    if arch != "qwen3_5_text":
        w.add_expert_count(d["num_experts"])
        w.add_expert_used_count(d["num_experts_per_tok"])
        w.add_expert_feed_forward_length(d["moe_intermediate_size"])  # Qwen2MoeModel
        w.add_expert_shared_feed_forward_length(d["shared_expert_intermediate_size"])
    w.add_ssm_conv_kernel(d["linear_conv_kernel_dim"])  # Qwen3NextModel
    w.add_ssm_state_size(d["linear_key_head_dim"])
    w.add_ssm_group_count(d["linear_num_key_heads"])
    w.add_ssm_time_step_rank(d["linear_num_value_heads"])
    w.add_ssm_inner_size(d["linear_value_head_dim"] * d["linear_num_value_heads"])
    w.add_full_attention_interval(4)
    w.add_rope_dimension_count(int(hd * rope["partial_rotary_factor"]))
    if arch != "qwen3_next":
        w.add_rope_dimension_sections([11, 11, 10, 0])  # _Qwen35MRopeMixin's default
    if mtp:
        w.add_nextn_predict_layers(1)
        g = torch.Generator().manual_seed(5)
        w.add_tensor(f"blk.{n}.nextn.eh_proj.weight", torch.randn(64, 128, generator=g).numpy())
        w.add_tensor(f"blk.{n}.attn_norm.weight", np.ones(64, dtype=np.float32))
    _tokenizer(w)
    finish_gguf(w, _tensors(arch, d, sd), q8)
    return model, d


@pytest.mark.parametrize(
    ("arch", "mtp"), [*((a, False) for a in ARCH), ("qwen3_5_text", True)], ids=[*ARCH, "qwen3_5_text-mtp"]
)
def test_qwen_gguf_roundtrip_matches_hf_weights(tmp_path: Path, arch: str, mtp: bool) -> None:
    """(With an appended MTP block: ``block_count`` counts it, ``nextn_predict_layers`` takes it off.)"""
    path = tmp_path / f"{arch}.gguf"
    ref, d = write_qwen_gguf(path, arch, mtp=mtp)
    cfg, raw, tensors = load_gguf(path)
    want = normalize_config(d)
    assert raw["model_type"] == arch
    assert replace(cfg, max_position_embeddings=want.max_position_embeddings) == want
    expected = {k: v.float() for k, v in ref.state_dict().items()}
    if want.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
    assert_same_model(cfg, tensors, expected, ref, ("A_log", "norm.weight"))  # log(-(-exp(a))), (1 + w) - 1


@pytest.mark.parametrize("arch", list(ARCH))
def test_qwen_gguf_q8_0_close_to_hf_weights(tmp_path: Path, arch: str) -> None:
    """Q8_0 projections. Every quantized tensor, after our transforms (row / column reorders, joins),
    is within Q8_0's rounding bound (half a step of max|w| / 127, plus the fp16 scale's rounding) of
    the F32 one, so a transform
    misapplied to a quantized tensor fails here. The logits: the tiny GDN models amplify weight
    rounding more than the tiny Mamba2 / conv ones (tied Q8_0 embeddings alone move Qwen3.5's by ~5%
    of their range, all projections ~6.5%), so the bound is 10% of the range here, not 2%; Qwen3-Next
    routes to all 4 experts, as a rounding can flip a top-2 choice, which no tolerance bounds."""
    extra: dict[str, Any] = {"num_experts_per_tok": 4} if arch != "qwen3_5_text" else {}
    ref, _ = write_qwen_gguf(tmp_path / "f32.gguf", arch, **extra)
    write_qwen_gguf(tmp_path / "q8.gguf", arch, q8=True, **extra)
    _, _, exact = load_gguf(tmp_path / "f32.gguf")
    cfg, _, tensors = load_gguf(tmp_path / "q8.gguf")
    moved = 0
    for k, v in exact.items():
        step = v.abs().max().item() / 127
        assert (tensors[k] - v).abs().max().item() <= 0.6 * step + 1e-7, k  # + the fp16 scale's rounding
        moved += int(not torch.equal(tensors[k], v))
    assert moved >= 10  # the projections really were quantized
    model = build_model(cfg)
    model.load_weights(tensors)
    ids = rand_tokens(40, seed=12)
    want, got = _logits(ref, ids), _logits(model, ids)
    err = (got - want).abs().max().item()
    assert 0 < err <= 0.1 * (want.max() - want.min()).item()


def test_qwen_archs_are_supported() -> None:
    assert {"qwen3next", "qwen35", "qwen35moe"} <= set(supported_archs())
