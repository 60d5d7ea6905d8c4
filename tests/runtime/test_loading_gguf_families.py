"""GGUF loading of the hybrid families: a tiny model of each is written as llama.cpp's
``convert_hf_to_gguf.py`` lays it out (metadata keys, tensor names through gguf-py's name map,
squeezed / reshaped / transformed SSM tensors, permuted Q/K rows), loaded with ``load_gguf`` and run:
its logits must equal those of the same model loaded from transformers' state dict."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hypic_agent.config import Settings
from hypic_agent.errors import ModelConfigError
from hypic_agent.runtime.models.families import normalize_config, to_contract
from hypic_agent.runtime.models.hybrid import build_model
from hypic_agent.runtime.models.loading.catalog import resolve_model
from hypic_agent.runtime.models.loading.gguf import load_gguf, supported_archs
from hypic_agent.runtime.models.loading.tokenizer import _bytes_to_unicode, load_tokenizer
from hypic_agent.runtime.models.loading.weights import load_weights
from hypic_agent.runtime.runner.standalone import prefill

from .conftest import finish_gguf, make_model, rand_tokens, write_stub_gguf

gguf = pytest.importorskip("gguf")

# a model whose config the converter changes: Granite's head_dim is dropped (llama.cpp derives
# hidden / heads), so the tiny Granite uses exactly that
OVERRIDES: dict[str, dict[str, Any]] = {"granitemoehybrid": {"head_dim": 16}}
GGUF_ARCH = {"lfm2": "LFM2", "granitemoehybrid": "GRANITE_HYBRID", "nemotron_h": "NEMOTRON_H"}


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf's ``LlamaModel.permute`` (``undo_permute`` families)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tokenizer(w: Any) -> None:
    chars = _bytes_to_unicode()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list([chars[b] for b in range(256)] + ["ĠĠ", "<|im_start|>", "<|im_end|>"])
    w.add_token_types([1] * 257 + [3] * 2)
    w.add_token_merges(["Ġ Ġ"])
    w.add_eos_token_id(258)


def _hub_names(arch: str, sd: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """transformers' state dict -> the checkpoint names the converter reads (hub layout)."""
    out: dict[str, np.ndarray] = {}
    for k, v in sd.items():
        if arch == "granitemoehybrid":
            k = k.replace(".block_sparse_moe.router.weight", ".block_sparse_moe.router.layer.weight")
            k = k.replace(".block_sparse_moe.experts.gate_up_proj", ".block_sparse_moe.input_linear.weight")
            k = k.replace(".block_sparse_moe.experts.down_proj", ".block_sparse_moe.output_linear.weight")
        if arch == "nemotron_h":
            k = k.replace("model.", "backbone.", 1)
        out[k] = v.numpy().astype(np.float32)
    return out


def _metadata(w: Any, arch: str, d: dict[str, Any], n_blocks: int, rope: bool = False) -> None:
    """The keys ``set_gguf_parameters`` of LFM2Model / GraniteHybridModel / NemotronHModel write."""
    w.add_block_count(n_blocks)
    w.add_embedding_length(d["hidden_size"])
    w.add_head_count(d["num_attention_heads"])
    w.add_vocab_size(d["vocab_size"])
    if arch == "lfm2":
        from hypic_agent.runtime.models.families.lfm2 import _lfm2_ff

        w.add_context_length(d["max_position_embeddings"])
        w.add_feed_forward_length(_lfm2_ff(d))
        w.add_head_count_kv([d["num_key_value_heads"] if t == "full_attention" else 0 for t in d["layer_types"]])
        w.add_rope_freq_base(d["rope_parameters"]["rope_theta"])
        w.add_layer_norm_rms_eps(d["norm_eps"])
        w.add_key_length(d["head_dim"])
        w.add_value_length(d["head_dim"])
        w.add_shortconv_l_cache(d["conv_L_cache"])
        return
    w.add_context_length(2**20)  # no RoPE: the converter's arbitrary length
    w.add_rope_scaling_finetuned(rope)  # True only for a converted Bamba
    heads, groups = (d["mamba_n_heads"], d["mamba_n_groups"]) if arch == "granitemoehybrid" else (0, d["n_groups"])
    if arch == "granitemoehybrid":
        attn = [i for i, t in enumerate(d["layer_types"]) if t == "attention"]
        w.add_feed_forward_length(d["intermediate_size"])
        w.add_layer_norm_rms_eps(d["rms_norm_eps"])
        w.add_expert_count(d["num_local_experts"])
        w.add_expert_used_count(d["num_experts_per_tok"])
        w.add_expert_shared_feed_forward_length(d["shared_intermediate_size"])
        w.add_attention_scale(d["attention_multiplier"])
        w.add_embedding_scale(d["embedding_multiplier"])
        w.add_residual_scale(d["residual_multiplier"])
        w.add_logit_scale(d["logits_scaling"])
        w.add_ssm_conv_kernel(d["mamba_d_conv"])
        w.add_ssm_state_size(d["mamba_d_state"])
        inner = d["mamba_expand"] * d["hidden_size"]
    else:
        pattern = d["hybrid_override_pattern"]
        attn = [j for j, c in enumerate(pattern) if c == "*"]
        heads = d["mamba_num_heads"]
        w.add_feed_forward_length([d["intermediate_size"] if c == "-" else 0 for c in pattern])
        w.add_layer_norm_eps(d["layer_norm_epsilon"])  # TextModel: layer_norm_epsilon -> LAYERNORM_EPS
        w.add_key_length(d["head_dim"])
        w.add_value_length(d["head_dim"])
        w.add_ssm_conv_kernel(d["conv_kernel"])
        w.add_ssm_state_size(d["ssm_state_size"])
        inner = heads * d["mamba_head_dim"]
    w.add_head_count_kv([d["num_key_value_heads"] if i in attn else 0 for i in range(n_blocks)])
    w.add_ssm_group_count(groups)
    w.add_ssm_inner_size(inner)
    w.add_ssm_time_step_rank(heads)


def _tensors(arch: str, d: dict[str, Any], hub: dict[str, np.ndarray], n_blocks: int) -> list[tuple[str, np.ndarray]]:
    """The converter's ``modify_tensors``: names via gguf-py's map, values as llama.cpp stores them."""
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[GGUF_ARCH[arch]], n_blocks)
    fmt = gguf.TENSOR_NAMES
    out: list[tuple[str, np.ndarray]] = []
    for k, v in hub.items():
        if k.endswith(".dt_bias"):
            k = k[: -len("dt_bias")] + "dt_proj.bias"
        bid = int(k.split(".")[2]) if ".layers." in k else -1
        if arch == "granitemoehybrid" and k.endswith("input_linear.weight"):
            half = v.shape[-2] // 2
            if "block_sparse_moe" in k:
                kinds = ("FFN_GATE_EXP", "FFN_UP_EXP")
            else:  # the shared MLP: shared expert of a MoE, or the dense MLP
                kinds = ("FFN_GATE_SHEXP", "FFN_UP_SHEXP") if d["num_local_experts"] else ("FFN_GATE", "FFN_UP")
            for kind, part in zip(kinds, (v[..., :half, :], v[..., half:, :])):
                out.append((fmt[gguf.MODEL_TENSOR[kind]].format(bid=bid) + ".weight", np.ascontiguousarray(part)))
            continue
        g = names.get_name(k, try_suffixes=(".weight", ".bias"))
        if arch == "granitemoehybrid" and not d["num_local_experts"] and k.endswith("shared_mlp.output_linear.weight"):
            g = fmt[gguf.MODEL_TENSOR.FFN_DOWN].format(bid=bid) + ".weight"
        assert g is not None, k
        if g.endswith((".shortconv.conv.weight", ".ssm_conv1d.weight")):
            v = v.squeeze(1)
        elif g.endswith((".ssm_a", ".ssm_d")):
            v = v.reshape(*v.shape, 1)
        elif g.endswith(".ssm_norm.weight"):
            groups = d["mamba_n_groups"] if arch == "granitemoehybrid" else d["n_groups"]
            v = v.reshape(groups, -1)
        if g.endswith(".ssm_a"):
            v = -np.exp(v)
        if arch != "lfm2" and g.endswith(".attn_q.weight"):
            v = _permute(v, d["num_attention_heads"])
        elif arch != "lfm2" and g.endswith(".attn_k.weight"):
            v = _permute(v, d["num_key_value_heads"])
        out.append((g, np.ascontiguousarray(v)))
    return out


def write_family_gguf(
    path: Path, arch: str, *, q8: bool = False, seed: int = 0, rope: bool = False, **overrides: Any
) -> tuple[Any, dict[str, Any]]:
    """Write the tiny ``arch`` model as a GGUF; returns (our model from transformers' weights, HF config).
    ``q8``: 2-D projection weights stored as Q8_0 (norms, SSM vectors, conv kernels stay F32 as
    llama.cpp keeps them)."""
    model, sd, d = make_model(arch, seed=seed, **{**OVERRIDES.get(arch, {}), **overrides})
    n_blocks = len(d["hybrid_override_pattern"]) if arch == "nemotron_h" else d["num_hidden_layers"]
    w = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH[GGUF_ARCH[arch]]])
    w.add_name(f"tiny-{arch}")
    _metadata(w, arch, d, n_blocks, rope)
    _tokenizer(w)
    finish_gguf(w, _tensors(arch, d, _hub_names(arch, sd), n_blocks), q8, keep_float=("conv", "ssm_norm"))
    return model, d


def _logits(model: Any, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return prefill(model, [ids], all_logits=True)[0].all_logits


def assert_same_model(
    cfg: Any, tensors: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], ref: Any, inexact: tuple[str, ...]
) -> None:
    """A GGUF's tensors equal the HF-loaded ones (names ending in ``inexact``: to 1e-6, they went
    through a transform and back) and a model built from them gives ``ref``'s logits to 1e-5."""
    assert set(tensors) == set(expected)
    for k, v in expected.items():
        if k.endswith(inexact):
            assert torch.allclose(tensors[k], v, rtol=0, atol=1e-6), k
        else:
            assert torch.equal(tensors[k], v), k
    model = build_model(cfg)
    model.load_weights(tensors)
    ids = rand_tokens(40, seed=11)
    assert (_logits(model, ids) - _logits(ref, ids)).abs().max().item() <= 1e-5


CASES = [*((a, {}) for a in GGUF_ARCH), ("granitemoehybrid", {"num_local_experts": 0})]  # + dense Granite 4


@pytest.mark.parametrize(("arch", "overrides"), CASES, ids=[*GGUF_ARCH, "granite-dense"])
def test_family_gguf_roundtrip_matches_hf_weights(tmp_path: Path, arch: str, overrides: dict[str, Any]) -> None:
    path = tmp_path / f"{arch}.gguf"
    ref, d = write_family_gguf(path, arch, **overrides)
    cfg, raw, tensors = load_gguf(path)
    want = normalize_config(d)
    # the config equals the one from config.json, up to the context length llama.cpp does not keep
    assert replace(cfg, max_position_embeddings=want.max_position_embeddings) == want
    assert raw["model_type"] == arch
    expected = to_contract(want, {k: v.float() for k, v in ref.state_dict().items()})
    if want.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
    assert_same_model(cfg, tensors, expected, ref, ("A_log",))  # log(-(-exp(A_log))): not bit-exact


@pytest.mark.parametrize("arch", ["lfm2", "nemotron_h"])
def test_family_gguf_q8_0_close_to_hf_weights(tmp_path: Path, arch: str) -> None:
    """Q8_0 projections: logits within 2% of the logit range of the fp32 model (dense families: in
    Granite's MoE a rounding can flip a top-k choice, which no tolerance bounds)."""
    path = tmp_path / f"{arch}-q8.gguf"
    ref, _ = write_family_gguf(path, arch, q8=True)
    cfg, _, tensors = load_gguf(path)
    model = build_model(cfg)
    model.load_weights(tensors)
    ids = rand_tokens(40, seed=12)
    want, got = _logits(ref, ids), _logits(model, ids)
    err = (got - want).abs().max().item()
    assert 0 < err <= 0.02 * (want.max() - want.min()).item()


def test_granitehybrid_with_rope_is_refused(tmp_path: Path) -> None:
    """``granitehybrid`` with ``rope.scaling.finetuned`` is a converted Bamba, not a Granite 4."""
    path = tmp_path / "bamba.gguf"
    write_family_gguf(path, "granitemoehybrid", rope=True)
    with pytest.raises(ModelConfigError, match="Bamba"):
        load_gguf(path)


def test_unsupported_arch_names_the_supported_ones(tmp_path: Path) -> None:
    path = write_stub_gguf(tmp_path / "rwkv7.gguf", "rwkv7")
    assert supported_archs() == [
        "falcon-h1", "granitehybrid", "kimi-linear", "lfm2", "llama", "nemotron_h", "qwen35", "qwen35moe",
        "qwen3next",
    ]  # fmt: skip
    with pytest.raises(
        ModelConfigError, match=r"'rwkv7' is not supported \(supported: \['falcon-h1', 'granitehybrid', 'kimi-linear'"
    ):
        load_gguf(path)


@pytest.mark.parametrize("arch", ["granitemoehybrid", "nemotron_h"])
def test_family_gguf_serves_as_a_model_source(tmp_path: Path, arch: str) -> None:
    """What ``serve --model x.gguf`` does: resolve, load weights, read the embedded tokenizer (for
    architectures transformers' GGUF config reader rejects, the tokenizer alone)."""
    path = tmp_path / f"{arch}.gguf"
    write_family_gguf(path, arch)
    source = resolve_model(str(path), Settings(), fetch=False)
    assert source.kind == "gguf"
    loaded = load_weights(source)
    assert loaded.config.family == arch and loaded.fingerprint.startswith(f"{arch}:float32:")
    tok = load_tokenizer(source)
    ids = tok("a   b", add_special_tokens=False)["input_ids"]
    assert ids == [97, 256, 32, 98] and tok.eos_token_id == 258


def test_lfm2_layout_agrees_with_transformers_gguf_reader(tmp_path: Path) -> None:
    """transformers reads LFM2 GGUFs itself: on our tiny file it gives transformers' very state dict,
    so the layout written here (and read by ``load_gguf``) is the one its reader was built for."""
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from hypic_agent.runtime.models.testing.tiny import hf_config_object

    path = tmp_path / "lfm2.gguf"
    write_family_gguf(path, "lfm2")
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(hf_config_object(load_gguf_checkpoint(str(path))["config"]))
    theirs = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=hf)["tensors"]
    cfg, _, ours = load_gguf(path)
    assert set(to_contract(cfg, theirs)) == set(ours)
    for k, v in to_contract(cfg, theirs).items():
        assert torch.equal(v.float(), ours[k]), k
