"""``load_gguf``: a tiny llama GGUF written here with gguf-py, and the real SmolLM2-135M file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hypic_agent.config import Settings
from hypic_agent.errors import ModelConfigError, WeightsError
from hypic_agent.runtime.models.loading.catalog import CATALOG, ModelSource, catalog_path
from hypic_agent.runtime.models.loading.gguf import load_gguf
from hypic_agent.runtime.models.loading.tokenizer import _bytes_to_unicode, load_tokenizer
from hypic_agent.runtime.models.loading.weights import load_weights
from hypic_agent.runtime.models.testing.tiny import random_state_dict, tiny_config

from .conftest import write_stub_gguf

gguf = pytest.importorskip("gguf")

HF_TO_GGUF = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf Q/K row permutation (the loader must undo it)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_llama_gguf(path: Path, *, tied: bool = True, quantize_mlp: bool = False) -> dict[str, torch.Tensor]:
    """Tiny llama (F32, MLP optionally Q8_0) + a byte-level gpt2 tokenizer; returns the expected tensors."""
    d = tiny_config("llama")
    d["tie_word_embeddings"] = tied
    sd = random_state_dict(d, seed=5)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_block_count(d["num_hidden_layers"])
    w.add_context_length(d["max_position_embeddings"])
    w.add_embedding_length(d["hidden_size"])
    w.add_feed_forward_length(d["intermediate_size"])
    w.add_head_count(d["num_attention_heads"])
    w.add_head_count_kv(d["num_key_value_heads"])
    w.add_rope_dimension_count(d["head_dim"])
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(d["rms_norm_eps"])
    w.add_vocab_size(d["vocab_size"])
    chars = _bytes_to_unicode()
    # byte tokens, one merge (gguf-py/transformers need a non-empty merge list), two specials
    tokens = [chars[b] for b in range(256)] + ["ĠĠ", "<|im_start|>", "<|im_end|>"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([1] * 257 + [3] * 2)
    w.add_token_merges(["Ġ Ġ"])
    w.add_eos_token_id(258)
    w.add_bos_token_id(257)
    expected: dict[str, torch.Tensor] = {}
    for name, t in sd.items():
        if name.startswith("model.layers."):
            i, rest = name[len("model.layers.") :].split(".", 1)
            gname = f"blk.{i}.{LAYER[rest]}"
        else:
            gname = HF_TO_GGUF[name]
        arr = t.numpy().astype(np.float32)
        stored = arr
        if gname.endswith("attn_q.weight"):
            stored = _permute(arr, d["num_attention_heads"])
        elif gname.endswith("attn_k.weight"):
            stored = _permute(arr, d["num_key_value_heads"])
        if quantize_mlp and ".ffn_" in gname and "norm" not in gname:
            q = gguf.quantize(stored, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(gname, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            arr = gguf.dequantize(q, gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(gname, stored)
        expected[name] = torch.from_numpy(np.array(arr, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected


@pytest.mark.parametrize("tied", [True, False])
def test_tiny_gguf_roundtrip(tmp_path: Path, tied: bool) -> None:
    path = tmp_path / "tiny.gguf"
    expected = write_tiny_llama_gguf(path, tied=tied)
    cfg, raw, tensors = load_gguf(path)
    assert raw["model_type"] == "llama" and raw["tie_word_embeddings"] is tied
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (4, 64, 4, 2)
    assert cfg.vocab_size == 259 and cfg.eos_token_ids == (258,) and cfg.tie_word_embeddings is tied
    assert set(tensors) == set(expected)
    for k, v in expected.items():
        assert torch.equal(tensors[k], v), k


def test_tiny_gguf_quantized_and_dtype(tmp_path: Path) -> None:
    path = tmp_path / "tiny-q8.gguf"
    expected = write_tiny_llama_gguf(path, quantize_mlp=True)
    _, _, tensors = load_gguf(path)
    for k, v in expected.items():
        assert torch.equal(tensors[k], v), k
    _, _, bf = load_gguf(path, dtype=torch.bfloat16)
    up = "model.layers.0.mlp.up_proj.weight"
    assert bf[up].dtype == torch.bfloat16 and torch.equal(bf[up], expected[up].bfloat16())


def test_tiny_gguf_tokenizer_and_source(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    write_tiny_llama_gguf(path)
    tok = load_tokenizer(path)
    assert tok("héllo", add_special_tokens=False)["input_ids"] == list("héllo".encode())
    ids = tok("a   b", add_special_tokens=False)["input_ids"]  # GPT-2 split: "a", "  ", " b"
    assert ids == [97, 256, 32, 98] and tok.decode(ids) == "a   b"
    assert tok.eos_token_id == 258
    a = load_weights(ModelSource(name="t", kind="gguf", path=path))
    assert a.fingerprint.startswith("llama:float32:")
    assert a.fingerprint == load_weights(ModelSource(name="t", kind="gguf", path=path)).fingerprint


def test_gguf_errors(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match="does not exist"):
        load_gguf(tmp_path / "missing.gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(WeightsError, match="corrupt"):
        load_gguf(bad)
    other = write_stub_gguf(tmp_path / "mamba.gguf", "mamba")
    with pytest.raises(ModelConfigError, match="'mamba' is not supported"):
        load_gguf(other)


# ---------------------------------------------------------------------------- real SmolLM2
def _smollm2() -> Path | None:
    entry = CATALOG["smollm2-135m-instruct"]
    for p in (catalog_path(entry, Settings()), Path("/tmp/smol") / entry.member):
        if p.is_file() and p.stat().st_size == entry.size:
            return p
    return None


SMOL = _smollm2()
needs_smol = pytest.mark.skipif(
    SMOL is None, reason="SmolLM2 GGUF not present: run `hypic-agent models fetch smollm2-135m-instruct`"
)


@pytest.fixture(scope="module")
def smol() -> tuple:
    assert SMOL is not None
    return load_gguf(SMOL)


@needs_smol
def test_smollm2_config(smol: tuple) -> None:
    cfg, _raw, tensors = smol
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (30, 576, 9, 3)
    assert cfg.tie_word_embeddings and "lm_head.weight" not in tensors
    assert cfg.family == "llama" and cfg.head_dim == 64 and cfg.rope_theta == 100000.0
    assert cfg.vocab_size == 49152 and cfg.eos_token_ids == (2,)
    assert all(t.dtype == torch.float32 for t in tensors.values())
    for name in ("model.embed_tokens.weight", "model.layers.29.self_attn.k_proj.weight", "model.norm.weight"):
        assert torch.isfinite(tensors[name]).all() and tensors[name].abs().mean() > 1e-3


@needs_smol
@pytest.mark.slow  # ~15 s: transformers' own GGUF path parses the file twice
def test_smollm2_matches_transformers(smol: tuple) -> None:
    """transformers' own GGUF path for LlamaForCausalLM yields bit-identical tensors."""
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from hypic_agent.runtime.models.testing.tiny import hf_config_object

    _, _, tensors = smol
    meta = load_gguf_checkpoint(str(SMOL))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config_object(meta["config"]))
    assert type(model).__name__ == "LlamaForCausalLM"
    ref = load_gguf_checkpoint(str(SMOL), return_tensors=True, model_to_load=model)["tensors"]
    assert set(ref) == set(tensors)
    for k in ref:
        assert torch.equal(ref[k], tensors[k]), k
    names = set(model.state_dict()) - {"lm_head.weight"}
    assert names == set(tensors)
