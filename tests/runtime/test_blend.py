"""``seam="blend"``: scattered body tokens recomputed in the combine under the seam budget."""

from __future__ import annotations

import pytest
import torch

from hypic_agent.runtime.hypic.auto_seams import SeamProfile
from hypic_agent.runtime.hypic.blend import BlendPlan, measure_tokens, sink_seams
from hypic_agent.runtime.hypic.build import build_entries
from hypic_agent.runtime.hypic.combine import combine
from hypic_agent.runtime.hypic.layout import plan_layout
from hypic_agent.runtime.hypic.modes import mode_spec, validate_seam
from hypic_agent.runtime.hypic.probe import probe
from hypic_agent.runtime.runner.standalone import prefill
from hypic_agent.runtime.state import LinearLayerState

from .conftest import Plan, make_model, rand_tokens
from .test_auto_seams import docs, engine

CPU = torch.device("cpu")


def _prompt() -> tuple[list[tuple[int, ...]], list[int]]:
    return [tuple(rand_tokens(n, i)) for i, n in enumerate((20, 17, 25))], rand_tokens(5, 9)


def test_every_body_token_blended_is_the_one_pass_on_an_attention_model():
    model, _, _ = make_model("llama")
    segs, suffix = _prompt()
    ref = prefill(model, [[t for s in segs for t in s] + suffix])[0].last_logits
    seams = [4, 4, 4]
    entries = build_entries(model, segs, seams)
    every = [list(range(4, len(s))) for s in segs]
    lay = plan_layout(segs, entries, seams, suffix, CPU, every)
    starts = [0, 20, 37, 62]
    assert lay.blend_pos == [p for i in range(3) for p in range(starts[i] + 4, starts[i + 1])]
    got = combine(model, lay, entries, mode_spec("hypic"))
    assert (got.last_logits.float() - ref.float()).abs().max().item() < 1e-4
    # and a few of them move the logits towards it
    spec = mode_spec("hypic")
    base = combine(model, plan_layout(segs, entries, seams, suffix, CPU), entries, spec)
    some = combine(model, plan_layout(segs, entries, seams, suffix, CPU, [[], [4, 5, 9], [4, 6, 20]]), entries, spec)
    assert not torch.equal(some.last_logits, base.last_logits)


def test_layout_rows_and_key_carry_the_blend_offsets():
    model, _, _ = make_model("qwen3_5_text")
    segs, suffix = _prompt()
    entries = build_entries(model, segs, [3, 3, 3])
    plain = plan_layout(segs, entries, [3, 3, 3], suffix, CPU)
    lay = plan_layout(segs, entries, [3, 3, 3], suffix, CPU, [[], [5, 9], [3, 20]])
    assert plain.piece_rows is None and plain.blend_rows is None
    assert lay.active_pos.tolist() == [0, 1, 2, 20, 21, 22, 25, 29, 37, 38, 39, 40, 57, *range(62, 67)]
    assert lay.blend_rows.tolist() == [6, 7, 11, 12] and lay.blend_pos == [25, 29, 40, 57]
    assert torch.equal(lay.active_pos[lay.piece_rows], plain.active_pos)
    assert lay.cu_host == plain.cu_host and lay.chain == plain.chain
    assert lay.shape_key[: len(plain.shape_key)] == plain.shape_key and lay.shape_key != plain.shape_key
    assert lay.blend_groups == [(3, 0, 2), (5, 2, 4)]  # the bodies of segments 1 and 2 in the chain


def test_blend_rows_leave_the_hybrid_chain_alone():
    """Linear layers below the first attention layer see only pieces and pairs: same states."""
    model, _, _ = make_model("qwen3_5_text")
    segs, suffix = _prompt()
    entries = build_entries(model, segs, [3, 3, 3])
    spec = mode_spec("hypic")
    base = combine(model, plan_layout(segs, entries, [3, 3, 3], suffix, CPU), entries, spec)
    lay = plan_layout(segs, entries, [3, 3, 3], suffix, CPU, [[], [5, 9], [3, 20]])
    got = combine(model, lay, entries, spec)
    first_attn = model.config.layer_types.index("attention")
    for a, b in zip(base.layers[:first_attn], got.layers[:first_attn], strict=True):
        assert isinstance(a, LinearLayerState) and isinstance(b, LinearLayerState)
        assert torch.allclose(a.recurrent, b.recurrent, atol=1e-5) and torch.allclose(a.conv, b.conv, atol=1e-5)
    rows = probe(model, lay, entries, spec)  # the probe runs the same rows: its last one is the logits
    assert torch.allclose(rows.logits[-1], got.last_logits.float(), atol=1e-5)


def test_sink_seams_go_to_the_largest_offset_zero_deviation_while_the_budget_lasts():
    zero = SeamProfile((), 0.0)
    p, q, r = SeamProfile((9.0, 1.0), 0.0), SeamProfile((8.0,), 0.0), SeamProfile((8.0,), 0.0)
    assert sink_seams([6, 6, 4, 5], [zero, p, q, r], 10, 1) == [0, 1, 1, 1]  # the first: exact, none
    assert sink_seams([6, 6, 4, 5], [zero, p, q, r], 2, 1) == [0, 1, 1, 0]  # ties: the earlier one
    assert sink_seams([6, 6, 2, 5], [zero, p, None, r], 7, 3) == [0, 3, 0, 3]  # a hybrid's conv window
    assert sink_seams([6, 6, 2, 5], [zero, p, q, r], 7, 3) == [0, 3, 2, 0]  # a short segment: whole


def test_pick_takes_the_top_scores_inside_the_bodies_and_is_deterministic():
    model, _, _ = make_model("llama")
    segs, suffix = _prompt()
    entries = build_entries(model, segs, [1, 1, 1])
    profiles = [SeamProfile((), 0.0), SeamProfile((1.0,) * 17, 0.0), SeamProfile((1.0,) * 25, 0.0)]
    plan = BlendPlan([0, 1, 1], profiles, 9, len(model.layers), 2 + len(suffix), len(model.layers))
    got = plan.pick(model, segs, entries, suffix)
    assert got[0] == [] and sum(map(len, got)) == 9  # the first segment predicts no deviation
    assert all(1 <= j < len(s) for o, s in zip(got, segs, strict=True) for j in o)
    assert all(o == sorted(set(o)) for o in got)
    assert got == plan.pick(model, segs, entries, suffix)
    assert plan.recomputed([True, True, True]) == 2 + 9 + 2 + len(suffix)


def test_token_profile_is_zero_without_context_and_covers_the_segment():
    model, _, _ = make_model("qwen3_5_text")
    seg = rand_tokens(70, 5)
    assert measure_tokens(model, seg, []).dev == pytest.approx([0.0] * 70, abs=1e-5)
    a = measure_tokens(model, seg, rand_tokens(6, 1))
    assert len(a.dev) == 70 and max(a.dev) > 0 and a == measure_tokens(model, seg, rand_tokens(6, 1))


@pytest.mark.parametrize("arch", ["llama", "qwen3_5_text"])
def test_budget_covering_every_token_equals_full_recompute(arch):
    eng = engine(arch, 1.0)
    plan = Plan(docs())
    full = eng.prepare(plan, mode="full_recompute")
    got = eng.prepare(plan, mode="hypic", seam="blend")
    assert got.cached_tokens == 0 and all(u.id is None for u in got.segments)
    assert (got.state.last_logits - full.state.last_logits).abs().max().item() < 1e-4


@pytest.mark.parametrize("arch", ["llama", "qwen3_5_text"])
def test_blend_is_deterministic_and_inside_the_budget(arch):
    eng = engine(arch, 0.2)
    plan = Plan(docs())
    p = eng.pieces(plan, mode="hypic", seam="blend")
    seams, keys, bp = eng.seam_plan(p, "default")
    assert bp is not None and seams[0] == 0 and all(w == (3 if arch != "llama" else 1) for w in seams[1:])
    total = sum(len(s) for s in p.segs)
    assert 0 < bp.tokens and bp.recomputed([k is not None for k in keys]) <= int(0.2 * total)
    assert eng.seam_plan(p, "default") == (seams, keys, bp)
    a = eng.prepare(plan, mode="hypic", seam="blend")
    b = eng.prepare(plan, mode="hypic", seam="blend")  # now from the cache
    assert torch.equal(a.state.last_logits, b.state.last_logits)
    assert b.cached_tokens == total - sum(seams) - bp.tokens


def test_validate_seam_accepts_blend():
    assert validate_seam("blend") == "blend"


def test_a_budget_too_small_for_the_scout_picks_by_deviation_alone():
    eng = engine("llama", 0.03)
    p = eng.pieces(Plan(docs()), mode="hypic", seam="blend")
    _, keys, bp = eng.seam_plan(p, "default")
    assert bp is not None and bp.scout_layers == 0 and bp.tokens > 0
    assert bp.recomputed([k is not None for k in keys]) <= int(0.03 * sum(len(s) for s in p.segs))
    got = eng.prepare(Plan(docs()), mode="hypic", seam="blend")
    assert got.state.last_logits is not None


@pytest.mark.parametrize("arch", ["lfm2", "granitemoehybrid", "kimi_linear", "bailing_hybrid", "falcon_h1"])
def test_blend_runs_on_every_family_and_is_deterministic(arch):
    """Short conv, Mamba2, KDA + MLA, Lightning with RoPE, parallel Falcon-H1 halves: blend rows
    through each kind's linear layers, and (on MLA) the scout without a mass read."""
    eng = engine(arch, 0.3)
    plan = Plan(docs())
    a = eng.prepare(plan, mode="hypic", seam="blend")
    b = eng.prepare(plan, mode="hypic", seam="blend")
    _, _, bp = eng.seam_plan(eng.pieces(plan, mode="hypic", seam="blend"), "default")
    assert bp is not None and bp.tokens > 0
    assert torch.equal(a.state.last_logits, b.state.last_logits) and torch.isfinite(a.state.last_logits).all()
