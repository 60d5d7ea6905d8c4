"""Conversion of a Llama teacher into the qwen3_5_text hybrid student."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from hypic_agent.runtime.models.families import normalize_config
from hypic_agent.runtime.models.hybrid import build_model
from hypic_agent.runtime.models.testing.tiny import build_hf_model, random_state_dict, tiny_config
from hypic_agent.runtime.runner.standalone import prefill
from hypic_agent.training.calibrate import collect_stats
from hypic_agent.training.convert import ConvertOptions, convert, mixer_names, parse_layer_list, student_hf_config
from hypic_agent.training.distill import run_distill

from .conftest import tiny_run_config

SMOLLM2 = {  # SmolLM2-135M-Instruct's config as its GGUF gives it
    "model_type": "llama", "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
    "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
    "rope_theta": 100000.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 8192, "tie_word_embeddings": True,
    "bos_token_id": 1, "eos_token_id": 2,
}  # fmt: skip


@pytest.fixture(scope="module")
def tiny_teacher():
    raw = tiny_config("llama")
    raw["num_hidden_layers"] = 8
    sd = random_state_dict(raw, 0)
    # trained LLMs' residual streams have a large shared component (what holds the gates open);
    # random weights do not: give the embeddings one
    emb = sd["model.embed_tokens.weight"]
    shared = torch.randn(emb.shape[1], generator=torch.Generator().manual_seed(1))
    sd["model.embed_tokens.weight"] = emb + 3 * emb.std() * shared
    model = build_model(raw)
    model.load_weights(sd)
    stats = collect_stats(
        model, torch.randint(0, raw["vocab_size"], (4, 48), generator=torch.Generator().manual_seed(0))
    )
    return raw, sd, model, stats


def test_smollm2_student_layout() -> None:
    cfg = normalize_config(student_hf_config(SMOLLM2, ConvertOptions()))
    assert cfg.model_type == "qwen3_5_text" and cfg.num_layers == 30
    assert cfg.attention_layers == [3, 7, 11, 15, 19, 23, 27]
    assert (cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim) == (9, 9, 64)
    assert cfg.linear_value_head_dim == 64 and cfg.linear_conv_kernel_dim == 4
    assert (cfg.head_dim, cfg.rotary_dim, cfg.rope_theta) == (128, 64, 100000.0)
    assert cfg.vocab_size == 49152 and cfg.tie_word_embeddings and cfg.attn_output_gate and cfg.qk_norm
    plain = normalize_config(student_hf_config(SMOLLM2, ConvertOptions(attn_head_dim=None)))
    assert (plain.head_dim, plain.rotary_dim) == (64, 64)


def test_conversion_shapes_and_copies(tiny_teacher) -> None:
    raw, sd, _, stats = tiny_teacher
    conv = convert(raw, sd, stats)
    cfg = normalize_config(conv.hf_config)
    student = build_model(cfg)
    student.load_weights(conv.tensors)  # strict: every name, every shape
    assert conv.hf_config["layer_types"][3] == "full_attention" and conv.hf_config["layer_types"][7] == "full_attention"
    p = "model.layers.0."
    h, dh, d = raw["num_attention_heads"], raw["head_dim"], raw["hidden_size"]
    qkv = conv.tensors[p + "linear_attn.in_proj_qkv.weight"]
    assert torch.equal(qkv[: h * dh], sd[p + "self_attn.q_proj.weight"])
    k_heads = qkv[h * dh : 2 * h * dh].view(h, dh, d)
    kv = sd[p + "self_attn.k_proj.weight"].view(-1, dh, d)
    assert torch.equal(k_heads[0], kv[0]) and torch.equal(k_heads[1], kv[0]) and torch.equal(k_heads[2], kv[1])
    assert torch.equal(conv.tensors[p + "linear_attn.out_proj.weight"], sd[p + "self_attn.o_proj.weight"])
    conv_w = conv.tensors[p + "linear_attn.conv1d.weight"]
    assert torch.all(conv_w[:, 0, -1] == 1.0) and torch.all(conv_w[:, 0, :-1] == 0)
    assert torch.allclose(conv.tensors[p + "input_layernorm.weight"], sd[p + "input_layernorm.weight"] - 1)
    assert torch.equal(conv.tensors[p + "mlp.up_proj.weight"], sd[p + "mlp.up_proj.weight"])
    assert "lm_head.weight" not in conv.tensors
    assert set(mixer_names(conv.tensors)) == {n for n in conv.tensors if "_attn." in n}
    assert all(r["gate_std"] < 1.0 for r in conv.report)


def test_student_runtime_matches_transformers(tiny_teacher) -> None:
    """The converted student (before training) gives the same logits in our runtime and in
    transformers' Qwen3_5ForCausalLM."""
    raw, sd, _, stats = tiny_teacher
    conv = convert(raw, sd, stats)
    student = build_model(conv.hf_config)
    student.load_weights(conv.tensors)
    hf = build_hf_model(conv.hf_config, conv.tensors)
    assert type(hf).__name__ == "Qwen3_5ForCausalLM"
    ids = torch.randint(0, raw["vocab_size"], (1, 40), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref = hf(ids).logits[0]
    ours = prefill(student, [ids[0].tolist()], all_logits=True)[0].all_logits
    assert (ours - ref).abs().max().item() < 1e-4


def test_kept_attention_starts_close_to_teacher(tiny_teacher) -> None:
    """All layers kept as (gated, q/k-normed, wide-head) attention: the student ~= the teacher.

    (On SmolLM2, all 30 layers converted this way: KL 0.23 nats/token vs 2.32 with plain
    64-wide heads, whose q/k norm drops the per-token q / k magnitudes; see docs/models.md.)"""
    raw, sd, teacher, stats = tiny_teacher
    ids = torch.randint(0, raw["vocab_size"], (1, 48), generator=torch.Generator().manual_seed(7))
    ref = prefill(teacher, [ids[0].tolist()], all_logits=True)[0].all_logits.log_softmax(-1)
    kls = []
    for opts in (ConvertOptions(attention_every=1, attn_head_dim=64),):
        conv = convert(raw, sd, stats, opts)
        student = build_model(conv.hf_config)
        student.load_weights(conv.tensors)
        out = prefill(student, [ids[0].tolist()], all_logits=True)[0].all_logits.log_softmax(-1)
        kls.append(float((ref.exp() * (ref - out)).sum(-1).mean()))
    assert kls[0] < 1e-4, kls


def test_layer_types_explicit_layers() -> None:
    full, lin = "full_attention", "linear_attention"
    assert ConvertOptions().layer_types(8) == [lin, lin, lin, full] * 2  # default: every 4th
    opts = ConvertOptions(attention_layers=(5, 0, 2))
    assert opts.attention_layers == (0, 2, 5)  # stored sorted
    assert opts.layer_types(8) == [full, lin, full, lin, lin, full, lin, lin]
    assert ConvertOptions(attention_layers=(0, 1, 2, 3)).layer_types(8)[:5] == [full] * 4 + [lin]  # exactly half
    assert ConvertOptions(attention_layers=[7]).layer_types(8) == [lin] * 7 + [full]  # a list is fine too
    with pytest.raises(ValueError, match="out of range"):
        ConvertOptions(attention_layers=(1, 8)).layer_types(8)
    with pytest.raises(ValueError, match="at most 4"):
        ConvertOptions(attention_layers=(0, 1, 2, 3, 4)).layer_types(8)
    with pytest.raises(ValueError, match="at most 4"):
        ConvertOptions(attention_layers=(0, 1, 2, 3, 4)).layer_types(9)  # 9 // 2
    assert ConvertOptions(attention_layers=(0, 1, 2, 3, 4)).layer_types(10).count(full) == 5
    with pytest.raises(ValueError, match="repeats layer"):
        ConvertOptions(attention_layers=(1, 3, 1))
    with pytest.raises(ValueError, match="negative"):
        ConvertOptions(attention_layers=(-1, 3))
    for bad in ((), ("1",), (1.5,), (True,)):
        with pytest.raises(ValueError, match="non-empty list of layer indices"):
            ConvertOptions(attention_layers=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="out of range"):
        student_hf_config(SMOLLM2, ConvertOptions(attention_layers=(3, 30)))


def test_parse_layer_list() -> None:
    assert parse_layer_list("1, 3,5") == (1, 3, 5) and parse_layer_list("7,") == (7,)
    assert parse_layer_list("") is None and parse_layer_list("  ") is None and parse_layer_list(None) is None
    with pytest.raises(ValueError, match="comma-separated"):
        parse_layer_list("1;3")


def test_conversion_with_explicit_attention_layers(tiny_teacher) -> None:
    """Attention kept exactly at the requested layers: config, tensors, runtime == transformers."""
    raw, sd, _, stats = tiny_teacher
    keep = (0, 2, 5)
    conv = convert(raw, sd, stats, ConvertOptions(attention_layers=keep))
    types = conv.hf_config["layer_types"]
    assert [i for i, t in enumerate(types) if t == "full_attention"] == list(keep)
    assert normalize_config(conv.hf_config).attention_layers == list(keep)
    for i in range(raw["num_hidden_layers"]):
        names = [n for n in conv.tensors if n.startswith(f"model.layers.{i}.")]
        attn, lin = any(".self_attn." in n for n in names), any(".linear_attn." in n for n in names)
        assert (attn, lin) == ((True, False) if i in keep else (False, True)), i
        assert conv.report[i]["linear"] == float(i not in keep)
    # kept attention = the teacher's q rows in the rotated part of the wider heads
    dh, h = raw["head_dim"], raw["num_attention_heads"]
    q = conv.tensors["model.layers.2.self_attn.q_proj.weight"].view(h, 2, -1, raw["hidden_size"])[:, 0, :dh]
    assert torch.equal(q.reshape(h * dh, -1), sd["model.layers.2.self_attn.q_proj.weight"])
    student = build_model(conv.hf_config)
    student.load_weights(conv.tensors)  # strict: every name, every shape
    hf = build_hf_model(conv.hf_config, conv.tensors)  # strict load into transformers' Qwen3_5ForCausalLM
    assert [hasattr(layer, "self_attn") for layer in hf.model.layers] == [i in keep for i in range(len(types))]
    ids = torch.randint(0, raw["vocab_size"], (1, 40), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        ref = hf(ids).logits[0]
    ours = prefill(student, [ids[0].tolist()], all_logits=True)[0].all_logits
    assert (ours - ref).abs().max().item() < 1e-4


def test_distill_with_explicit_attention_layers(tmp_path: Path, tiny_corpus: Path) -> None:
    """A run with attention_layers: the layout reaches the model, the log and distill.json; a resume
    asking for another layout and an impossible layout fail (the latter before any corpus work)."""
    logs: list[str] = []
    cfg = tiny_run_config(tmp_path / "run", data=tiny_corpus, steps=1, convert=ConvertOptions(attention_layers=(0, 2)))
    summary = run_distill(cfg, log=logs.append)
    assert summary["attention_layers"] == [0, 2]
    assert any("2 GDN + 2 attention layers [0, 2]" in line for line in logs), logs
    model = cfg.out / "model"
    config = json.loads((model / "config.json").read_text())
    assert config["layer_types"] == ["full_attention", "linear_attention", "full_attention", "linear_attention"]
    recorded = json.loads((model / "distill.json").read_text())
    assert recorded["attention_layers"] == [0, 2] and recorded["run"]["convert"]["attention_layers"] == [0, 2]
    other = replace(cfg, steps=2, resume=True, convert=ConvertOptions(attention_layers=(1, 3)))
    with pytest.raises(ValueError, match=r"checkpoint has attention layers \[0, 2\]"):
        run_distill(other, log=lambda s: None)
    too_many = tiny_run_config(tmp_path / "bad", convert=ConvertOptions(attention_layers=(0, 1, 2)))
    with pytest.raises(ValueError, match="at most 2"):
        run_distill(too_many, log=lambda s: None)
    assert not (tmp_path / "bad" / "corpus").exists()
