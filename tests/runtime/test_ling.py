"""Ling 3 (transformers' ``bailing_hybrid``): KDA pairs compose exactly; the MLA keys' RoPE part is
re-rotated like any attention key (transformers oracle: ``test_model_oracle`` over ``TINY_ARCHS``)."""

from __future__ import annotations

import pytest
import torch

from hypic_agent.runtime.hypic.build import build_entries
from hypic_agent.runtime.hypic.entry import LinearEntry
from hypic_agent.runtime.models.layers.mla import MLAttention

from .conftest import make_model, rand_tokens
from .test_family_pairs import compose, one_pass, rel, segments

ARCH = "bailing_hybrid"


def test_kda_entry_is_a_dense_pair_and_mla_rotates_its_rope_part():
    model, _, _ = make_model(ARCH)
    (entry,) = build_entries(model, [tuple(rand_tokens(30, 2))], [4])
    le = entry.layers[0]
    assert isinstance(le, LinearEntry) and le.T.shape == (4, 16, 16) and le.S.shape == (4, 16, 16)
    attn = model.layers[2].self_attn
    assert isinstance(attn, MLAttention) and attn.rotary_dim == 8 and attn.g_proj is not None


@pytest.mark.parametrize("w", [3, 8])  # seams >= conv kernel - 1
def test_kda_composed_state_equals_one_pass_at_layer0(w):
    model, _, _ = make_model(ARCH)
    segs, suffix = segments(), rand_tokens(5, 98)
    full = one_pass(model, segs, suffix)
    st, _ = compose(model, segs, suffix, "hypic", w)
    assert rel(st.layers[0].recurrent, full.layers[0].recurrent) <= 1e-5
    assert torch.allclose(st.layers[0].conv, full.layers[0].conv, atol=1e-6)


def test_mla_body_keys_are_rerotated_to_their_global_positions():
    """With MLA first, its inputs are token-local: the composed keys equal one pass's with re-rotation
    (``transition_rope``) and not without (``transition``)."""
    types = ["full_attention", "linear_attention", "linear_attention", "linear_attention"]
    model, _, _ = make_model(ARCH, layer_types=types)
    segs, suffix = segments(), rand_tokens(5, 97)
    ref = one_pass(model, segs, suffix).layers[0].k
    rot, _ = compose(model, segs, suffix, "transition_rope", 0)
    assert (rot.layers[0].k - ref).abs().max().item() <= 1e-5
    local, _ = compose(model, segs, suffix, "transition", 0)
    assert (local.layers[0].k - ref).abs().max().item() > 1e-2


def test_seams_covering_whole_segments_equal_full_recompute_in_every_layer():
    model, _, _ = make_model(ARCH)
    segs, suffix = segments(seed=7), rand_tokens(6, 95)
    full = one_pass(model, segs, suffix)
    st, _ = compose(model, segs, suffix, "hypic", 1.0)
    assert (st.last_logits - full.last_logits).abs().max().item() <= 1e-5
    for li in model.config.linear_layers:
        assert rel(st.layers[li].recurrent, full.layers[li].recurrent) <= 1e-5


def test_hf_folder_loads_and_matches_transformers(tmp_path):
    import json

    from safetensors.torch import save_file

    from hypic_agent.runtime.models.hybrid import build_model
    from hypic_agent.runtime.models.loading.weights import load_checkpoint
    from hypic_agent.runtime.models.testing.tiny import build_hf_model, tiny_config
    from hypic_agent.runtime.runner.standalone import prefill

    _, sd, raw = make_model(ARCH)
    hf = build_hf_model(raw, sd)
    save_file({k: v.contiguous() for k, v in hf.state_dict().items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(
        json.dumps({**tiny_config(ARCH), "architectures": ["BailingHybridForCausalLM"]})
    )
    cfg, _, tensors = load_checkpoint(tmp_path)
    assert cfg.family == "bailing_hybrid" and "model.layers.0.linear_attn.forget_gate.f_proj.weight" in tensors
    model = build_model(raw)
    model.load_weights(tensors)
    ids = rand_tokens(25, 6)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0, -1]
    assert (prefill(model, [ids])[0].last_logits - ref).abs().max().item() <= 1e-4
