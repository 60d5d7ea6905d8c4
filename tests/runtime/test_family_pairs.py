"""What a cached segment holds for LFM2's short-conv layers (the conv tail only) and Granite 4's Mamba2
layers (a per-head decay T and S), and that composing it is exact where the layer inputs are."""

from __future__ import annotations

import pytest
import torch

from hypic_agent.runtime.hypic.build import build_entries
from hypic_agent.runtime.hypic.combine import combine
from hypic_agent.runtime.hypic.entry import LinearEntry
from hypic_agent.runtime.hypic.layout import plan_layout
from hypic_agent.runtime.hypic.modes import mode_spec, seam_tokens
from hypic_agent.runtime.runner.standalone import prefill

from .conftest import make_model, rand_tokens

CPU = torch.device("cpu")


def segments(lengths=(30, 41, 26), seed=0):
    return [tuple(rand_tokens(n, seed + i)) for i, n in enumerate(lengths)]


def compose(model, segs, suffix, mode, w, entries=None):
    spec = mode_spec(mode)
    seams = [seam_tokens(w if spec.seams else 0, len(s)) for s in segs]
    entries = entries if entries is not None else build_entries(model, segs, seams)
    return combine(model, plan_layout(segs, entries, seams, suffix, CPU), entries, spec), entries


def one_pass(model, segs, suffix):
    return prefill(model, [[t for s in segs for t in s] + suffix])[0]


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


# ---------------------------------------------------------------------------- LFM2 (short conv)
def test_short_conv_entry_is_the_conv_tail_of_the_isolated_segment():
    model, _, _ = make_model("lfm2")
    segs = segments()
    entries = build_entries(model, segs, [8, 8, 8])
    lin = model.config.linear_layers
    for seg, e in zip(segs, entries, strict=True):
        alone = prefill(model, [list(seg)])[0]
        for li in lin:
            le = e.layers[li]
            assert isinstance(le, LinearEntry) and le.T.numel() == 0 and le.S.numel() == 0  # no pair
            assert le.conv_tail.shape == (64, 2)  # [hidden, W-1]
            assert torch.allclose(le.conv_tail, alone.layers[li].conv, atol=1e-6)
    assert entries[0].bytes_per_layer()["linear"] == 64 * 2 * 4


@pytest.mark.parametrize(("mode", "w"), [("transition", 0), ("hypic", 2), ("addition", 0)])
def test_all_conv_stack_is_exact_from_the_tails(mode, w):
    """Without attention every layer is local (receptive field 4 layers x 2 tokens < a segment), so
    the cached tails alone make the composed prompt exact in every mode, with or without seams; zeroed
    tails do not."""
    model, _, _ = make_model("lfm2", layer_types=["conv"] * 4)
    segs, suffix = segments(), rand_tokens(6, 99)
    full = one_pass(model, segs, suffix)
    st, entries = compose(model, segs, suffix, mode, w)
    assert (st.last_logits - full.last_logits).abs().max().item() < 1e-5
    for a, b in zip(st.layers, full.layers, strict=True):
        assert torch.allclose(a.conv, b.conv, atol=1e-5)
    for e in entries:
        for le in e.layers:
            le.conv_tail.zero_()
    broken, _ = compose(model, segs, suffix, mode, w, entries)
    assert (broken.last_logits - full.last_logits).abs().max().item() > 1e-2


# ---------------------------------------------------------------------------- Granite 4 (Mamba2)
def _granite_linear_only(slow: bool = True):
    return make_model("granitemoehybrid", slow_decay=slow, layer_types=["mamba"] * 4)


def test_mamba2_pair_is_a_per_head_cumulative_decay():
    model, _, _ = make_model("granitemoehybrid")
    seg = tuple(rand_tokens(40, 3))
    (entry,) = build_entries(model, [seg], [5])
    le = entry.layers[0]
    assert isinstance(le, LinearEntry)
    assert le.T.shape == (4,) and le.S.shape == (4, 16, 32)  # T [H], S [H, d_state, head_dim]
    assert le.T.nbytes == 16  # a GDN pair's T at these heads would be 4 x 16 x 16 floats
    layer = model.layers[0]
    with torch.no_grad():
        _, _, g, _ = layer.mixer_in(model.embed(torch.tensor(seg)))
    assert torch.allclose(le.T, g[5:].sum(0).exp(), rtol=1e-5)  # body = tokens 5..39
    assert (le.T < 1).all() and (le.T > 0).all()


@pytest.mark.parametrize("w", [3, 8])  # seams >= conv kernel - 1
def test_mamba2_composed_state_equals_one_pass_at_layer0(w):
    model, _, _ = _granite_linear_only()
    segs, suffix = segments(), rand_tokens(5, 98)
    full = one_pass(model, segs, suffix)
    st, _ = compose(model, segs, suffix, "hypic", w)
    assert rel(st.layers[0].recurrent, full.layers[0].recurrent) <= 1e-5
    assert torch.allclose(st.layers[0].conv, full.layers[0].conv, atol=1e-6)


def test_mamba2_addition_is_far_off_and_transition_is_not():
    """With the tiny model's decays (T of a 30-token body ~ e^-10 per head) dropping T keeps every
    earlier segment's state undecayed."""
    model, _, _ = _granite_linear_only(slow=False)
    with torch.no_grad():  # identity conv: no cross-segment conv effect, so T_C alone decides
        for layer in model.layers:
            w = layer.linear_attn.conv1d.weight
            w.zero_()
            w[..., -1] = 1.0
            layer.linear_attn.conv1d.bias.zero_()
    segs, suffix = segments(), rand_tokens(5, 96)
    ref = one_pass(model, segs, suffix).layers[0].recurrent
    add, _ = compose(model, segs, suffix, "addition", 0)
    tr, _ = compose(model, segs, suffix, "transition", 0)
    assert rel(tr.layers[0].recurrent, ref) < 1e-5
    assert rel(add.layers[0].recurrent, ref) > 0.2


def test_mamba2_seams_covering_whole_segments_equal_full_recompute_in_every_layer():
    model, _, _ = make_model("granitemoehybrid")
    segs, suffix = segments(seed=7), rand_tokens(6, 95)
    full = one_pass(model, segs, suffix)
    st, _ = compose(model, segs, suffix, "hypic", 1.0)
    assert (st.last_logits - full.last_logits).abs().max().item() < 1e-5
    for li in model.config.linear_layers:
        assert rel(st.layers[li].recurrent, full.layers[li].recurrent) <= 1e-5


# ---------------------------------------------------------------------------- MiniMax (Lightning)
def test_lightning_pair_is_the_fixed_decay_and_composes_exactly_without_seams():
    """A Lightning body's T is exp(-slope * body length) per head; with no conv, layer 0's composed
    state equals the one-pass state even at w = 0, and dropping T (addition) does not."""
    from hypic_agent.runtime.models.layers.lightning import lightning_slopes

    model, _, _ = make_model("minimax", layer_types=["linear_attention"] * 4)
    segs, suffix = segments(), rand_tokens(5, 94)
    entries = build_entries(model, segs, [0, 0, 0])
    slopes = torch.tensor(lightning_slopes(4, 0, 4))
    for seg, e in zip(segs, entries, strict=True):
        assert torch.allclose(e.layers[0].T, torch.exp(-slopes * len(seg)), rtol=1e-5)
        assert e.layers[0].conv_tail.numel() == 0
    ref = one_pass(model, segs, suffix).layers[0].recurrent
    tr, _ = compose(model, segs, suffix, "transition", 0, entries)
    add, _ = compose(model, segs, suffix, "addition", 0, entries)
    assert rel(tr.layers[0].recurrent, ref) <= 1e-5
    assert rel(add.layers[0].recurrent, ref) > 0.2


# ---------------------------------------------------------------------------- Kimi Linear (KDA)
def test_kda_dense_pairs_compose_to_the_one_pass_state_at_layer0():
    """KDA's transition mixes key channels: T is dense [H, K, K] (the chain of GDN), and with seams
    >= W-1 layer 0's composed state is the one-pass state; dropping T is far off."""
    model, _, _ = make_model("kimi_linear", layer_types=["linear_attention"] * 4)
    segs, suffix = segments(), rand_tokens(5, 93)
    (e,) = build_entries(model, [segs[0]], [3])
    assert e.layers[0].T.shape == (4, 16, 16)
    full = one_pass(model, segs, suffix).layers[0].recurrent
    st, _ = compose(model, segs, suffix, "hypic", 3)
    assert rel(st.layers[0].recurrent, full) <= 1e-5
    add, _ = compose(model, segs, suffix, "addition", 0)
    assert rel(add.layers[0].recurrent, full) > 0.2


@pytest.mark.parametrize("arch", ["lfm2", "granitemoehybrid", "nemotron_h", "minimax", "kimi_linear", "falcon_h1"])
def test_entries_round_trip_through_the_store_and_the_worker_wire(arch):
    """Empty short-conv pairs and 1-D Mamba2 T survive safetensors-style dicts and the scatter wire."""
    from hypic_agent.runtime.hypic.entry import SegmentEntry
    from hypic_agent.runtime.workers import protocol

    model, _, _ = make_model(arch)
    (e,) = build_entries(model, [tuple(rand_tokens(20, 1))], [4])
    ts = protocol.entry_tensors(e)
    wire = protocol.assemble(
        protocol.unpack(protocol.pack(ts), protocol.decode_meta(protocol.encode_meta(ts)), separate=True),
        model.config.layer_types, e.token_ids, e.seam, 0.0,
    )  # fmt: skip
    stored = SegmentEntry.from_tensors(e.to_tensors(), model.config.layer_types)
    for back in (wire, stored):
        assert back.nbytes() == e.nbytes()
        for la, lb in zip(e.layers, back.layers, strict=True):
            for a, b in zip(vars(la).values(), vars(lb).values(), strict=True):
                assert a.shape == b.shape and torch.equal(a, b)
