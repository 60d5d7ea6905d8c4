"""Falcon-H1: a Mamba2 and an attention mixer in parallel in every layer, served as two layers each
(``parallel_layer``). transformers' ``FalconH1ForCausalLM`` is the oracle (fp32, CPU)."""

from __future__ import annotations

import pytest
import torch

from hypic_agent.errors import ModelConfigError
from hypic_agent.runtime.hypic.build import build_entries
from hypic_agent.runtime.hypic.combine import combine
from hypic_agent.runtime.hypic.entry import AttentionEntry, LinearEntry
from hypic_agent.runtime.hypic.layout import plan_layout
from hypic_agent.runtime.hypic.modes import mode_spec, seam_tokens
from hypic_agent.runtime.models.families import normalize_config, to_contract
from hypic_agent.runtime.models.hybrid import build_model
from hypic_agent.runtime.models.layers.parallel_layer import ParallelAttentionHalf, ParallelSsmHalf
from hypic_agent.runtime.models.testing.tiny import build_hf_model, random_state_dict, tiny_config
from hypic_agent.runtime.runner.standalone import decode_step, prefill

from .conftest import make_model, rand_tokens

CPU = torch.device("cpu")
SECTIONS = [0.9, 1.1, 0.8, 1.25, 0.6]  # tiny:falcon_h1's ssm_multipliers (z, x, B, C, dt)
TOL = 1e-4
GATES = {  # (mamba_rms_norm, mamba_norm_before_gate) -> ParallelScales.ssm_norm
    (False, True): "none",
    (True, True): "norm_then_gate",
    (True, False): "gate_then_norm",
}


def _pair(**overrides):
    """Our model and transformers' on the same seeded weights."""
    model, sd, cfg = make_model("falcon_h1", **overrides)
    return model, build_hf_model(cfg, sd)


def _hf_logits(hf, ids: list[int], steps: int) -> tuple[torch.Tensor, list[torch.Tensor], list[int]]:
    x = torch.tensor([ids])
    with torch.no_grad():
        full = hf(x).logits[0]
        out = hf.generate(
            x, attention_mask=torch.ones_like(x), max_new_tokens=steps, do_sample=False, output_logits=True,
            return_dict_in_generate=True, pad_token_id=256,
        )  # fmt: skip
    return full, [lg[0] for lg in out.logits], out.sequences[0, len(ids) :].tolist()


# ---------------------------------------------------------------------------- config
def test_config_splits_each_layer_and_reads_the_multipliers():
    raw = {
        **tiny_config("falcon_h1"), "num_hidden_layers": 3, "mamba_d_ssm": None, "mamba_expand": 2,
        "mamba_d_head": "auto", "time_step_limit": [0.0, {"__float__": "Infinity"}], "head_dim": 16,
    }  # fmt: skip
    cfg = normalize_config(raw)
    assert cfg.family == "falcon_h1" and cfg.num_layers == 6
    assert cfg.linear_layers == [0, 2, 4] and cfg.attention_layers == [1, 3, 5]
    assert cfg.linear_value_dim == 2 * 64 and cfg.linear_value_head_dim == 32  # d_ssm = expand x hidden, 4 heads
    assert cfg.attention_scale == pytest.approx(0.8 / 4.0)  # key_multiplier x head_dim^-0.5
    assert cfg.embedding_multiplier == 2.0 and cfg.logits_scaling == 2.0  # 1 / lm_head_multiplier
    p = cfg.parallel
    assert p is not None
    assert (p.attention_in, p.attention_out, p.ssm_in, p.ssm_out) == (1.1, 0.9, 1.2, 0.7)
    assert (p.mlp_gate, p.mlp_down) == (1.3, 0.75)
    for (rms, before), mode in GATES.items():
        c = normalize_config({**raw, "mamba_rms_norm": rms, "mamba_norm_before_gate": before})
        assert c.parallel is not None and c.parallel.ssm_norm == mode


@pytest.mark.parametrize(
    ("override", "match"),
    [({"mlp_bias": True}, "mlp_bias"), ({"hidden_act": "gelu"}, "silu"), ({"mamba_d_head": 30}, "mamba_d_head")],
)
def test_config_refuses_what_is_not_built(override, match):
    with pytest.raises(ModelConfigError, match=match):
        normalize_config({**tiny_config("falcon_h1"), **override})


def test_layers_are_the_two_halves_with_one_mixer_each():
    model, _, _ = make_model("falcon_h1")
    kinds = [(type(la), la.mixer_kind, la.mlp is not None) for la in model.layers]
    ssm, att = (ParallelSsmHalf, "mamba2", False), (ParallelAttentionHalf, "attention", True)
    assert kinds == [ssm, att, ssm, att]
    assert model.layers[0].self_attn is None and model.layers[1].linear_attn is None


# ---------------------------------------------------------------------------- weights
def test_checkpoint_names_map_onto_the_halves_and_mapping_twice_is_a_no_op():
    cfg_raw = tiny_config("falcon_h1")
    cfg = normalize_config(cfg_raw)
    sd = random_state_dict(cfg_raw, seed=1)
    sd["model.layers.1.mamba.mup_vector"] = torch.ones(3)  # older checkpoints stored it
    ours = to_contract(cfg, sd)
    assert torch.equal(ours["model.layers.2.linear_attn.in_proj.weight"], sd["model.layers.1.mamba.in_proj.weight"])
    assert torch.equal(ours["model.layers.3.self_attn.k_proj.weight"], sd["model.layers.1.self_attn.k_proj.weight"])
    assert torch.equal(ours["model.layers.2.input_layernorm.weight"], sd["model.layers.1.input_layernorm.weight"])
    pre_ff = sd["model.layers.0.pre_ff_layernorm.weight"]
    assert torch.equal(ours["model.layers.1.post_attention_layernorm.weight"], pre_ff)
    assert torch.equal(ours["model.layers.1.mlp.down_proj.weight"], sd["model.layers.0.feed_forward.down_proj.weight"])
    assert torch.equal(ours["model.norm.weight"], sd["model.final_layernorm.weight"])
    assert not any("mup_vector" in k for k in ours)
    assert set(ours) == set(build_model(cfg, device="meta").state_dict())
    assert to_contract(cfg, ours) is ours


# ---------------------------------------------------------------------------- oracle
@pytest.mark.parametrize(("rms", "before"), list(GATES))
def test_logits_match_transformers_in_prefill_and_decode(rms, before):
    """Every position of a prefill and 4 cached decode steps, for each form of the SSM output gate."""
    model, hf = _pair(mamba_rms_norm=rms, mamba_norm_before_gate=before)
    ids = rand_tokens(37, seed=5)
    full, steps, new = _hf_logits(hf, ids, 4)
    st = prefill(model, [ids], all_logits=True)[0]
    assert (st.all_logits - full).abs().max().item() < TOL
    for t in range(4):
        assert (st.last_logits - steps[t]).abs().max().item() < TOL
        decode_step(model, [st], [new[t]])


@pytest.mark.parametrize(
    "override",
    [
        {"embedding_multiplier": 1.0}, {"lm_head_multiplier": 1.0}, {"key_multiplier": 1.0},
        {"attention_in_multiplier": 1.0}, {"attention_out_multiplier": 1.0}, {"ssm_in_multiplier": 1.0},
        {"ssm_out_multiplier": 1.0}, {"mlp_multipliers": [1.0, 0.75]}, {"mlp_multipliers": [1.3, 1.0]},
        *({"ssm_multipliers": [1.0 if j == i else m for j, m in enumerate(SECTIONS)]} for i in range(5)),
    ],
)  # fmt: skip
def test_every_multiplier_moves_the_logits(override):
    """Our model with one multiplier reset to 1 no longer matches the oracle: each one is wired in."""
    _, sd, cfg = make_model("falcon_h1")
    hf = build_hf_model(cfg, sd)
    ours = build_model({**cfg, **override})
    ours.load_weights(sd)
    ids = rand_tokens(20, seed=6)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    assert (prefill(ours, [ids], all_logits=True)[0].all_logits - ref).abs().max().item() > 1e-3


# ---------------------------------------------------------------------------- HYPIC
def _compose(model, segs, suffix, mode, w):
    spec = mode_spec(mode)
    seams = [seam_tokens(w if spec.seams else 0, len(s)) for s in segs]
    entries = build_entries(model, segs, seams)
    return combine(model, plan_layout(segs, entries, seams, suffix, CPU), entries, spec), entries


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def test_entry_of_a_layer_is_a_decay_pair_and_conv_tail_plus_the_attention_kv():
    model, _, _ = make_model("falcon_h1")
    seg = tuple(rand_tokens(40, 3))
    (e,) = build_entries(model, [seg], [5])
    ssm, att = e.layers[0], e.layers[1]
    assert isinstance(ssm, LinearEntry) and isinstance(att, AttentionEntry)
    assert ssm.T.shape == (4,) and ssm.S.shape == (4, 16, 32) and ssm.conv_tail.shape == (128 + 2 * 2 * 16, 3)
    assert att.k.shape == att.v.shape == (40, 2, 32)
    with torch.no_grad():
        _, _, g, _ = model.layers[0].mixer_in(model.embed(torch.tensor(seg)))
    assert torch.allclose(ssm.T, g[5:].sum(0).exp(), rtol=1e-5)  # body = tokens 5..39
    alone = prefill(model, [list(seg)])[0]
    assert torch.allclose(ssm.conv_tail, alone.layers[0].conv, atol=1e-6)
    assert torch.allclose(att.v, alone.layers[1].v, atol=1e-6)  # values are position-free


@pytest.mark.parametrize("w", [3, 8])  # seams >= conv kernel - 1
def test_composed_mamba2_pairs_equal_the_one_pass_state(w):
    """Layer 0's inputs are the embeddings (exact), so with seams covering the conv window the state
    composed from the cached pairs equals the one-pass state."""
    model, _, _ = make_model("falcon_h1", slow_decay=True)
    segs = [tuple(rand_tokens(n, i)) for i, n in enumerate((30, 41, 26))]
    suffix = rand_tokens(5, 98)
    full = prefill(model, [[t for s in segs for t in s] + suffix])[0]
    st, _ = _compose(model, segs, suffix, "hypic", w)
    assert _rel(st.layers[0].recurrent, full.layers[0].recurrent) <= 1e-5
    assert torch.allclose(st.layers[0].conv, full.layers[0].conv, atol=1e-6)
    add, _ = _compose(model, segs, suffix, "addition", 0)
    assert _rel(add.layers[2].recurrent, full.layers[2].recurrent) > 1e-2


def test_whole_segment_seams_equal_full_recompute_and_the_ladder_runs():
    model, _, _ = make_model("falcon_h1")
    segs = [tuple(rand_tokens(n, 10 + i)) for i, n in enumerate((30, 41, 26))]
    suffix = rand_tokens(6, 97)
    full = prefill(model, [[t for s in segs for t in s] + suffix])[0]
    st, _ = _compose(model, segs, suffix, "hypic", 1.0)
    assert (st.last_logits - full.last_logits).abs().max().item() < TOL
    for a, b in zip(st.layers, full.layers, strict=True):
        for x, y in zip(vars(a).values(), vars(b).values(), strict=True):
            assert torch.allclose(x, y, atol=1e-5)
    errs = {}
    for mode, w in (("hypic", 8), ("transition", 0), ("addition", 0)):
        got, _ = _compose(model, segs, suffix, mode, w)
        errs[mode] = (got.last_logits - full.last_logits).abs().max().item()
    assert 0 < errs["hypic"] < errs["addition"] and errs["transition"] < errs["addition"]
