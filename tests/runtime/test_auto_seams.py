"""``seam="auto"``: deterministic per-segment widths, inside the budget, and full_recompute at budget 1."""

from __future__ import annotations

import pytest
import torch

from hypic_agent.config import Settings
from hypic_agent.errors import InvalidRequestError
from hypic_agent.runtime.engine import Engine
from hypic_agent.runtime.hypic.auto_seams import SeamProfile, allocate, ladder_steps, measure_profile
from hypic_agent.runtime.hypic.modes import validate_seam
from hypic_agent.runtime.models.loading.tokenizer import tiny_tokenizer

from .conftest import Plan, Seg, make_model, rand_tokens


def docs(lengths=(30, 40, 24, 50), seed=600) -> list[Seg]:
    return [Seg(tuple(rand_tokens(n, seed + i))) for i, n in enumerate(lengths)]


def engine(arch: str, budget: float) -> Engine:
    model, _, _ = make_model(arch)
    return Engine(model, tiny_tokenizer(), "tiny-test", Settings(min_cached_tokens=4, seam_budget=budget))


def test_ladder_ends_at_the_whole_segment():
    assert ladder_steps(10) == [0, 2, 4, 8, 10]
    assert ladder_steps(10, floor=3) == [0, 4, 8, 10]
    assert ladder_steps(300) == [0, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 300]


def test_allocate_follows_gain_per_token_and_respects_the_budget():
    flat = SeamProfile((1.0,) * 8, 1.0)
    steep = SeamProfile((9.0, 9.0, 5.0, 5.0, 0.1, 0.1, 0.1, 0.1), 0.1)
    zero = SeamProfile((), 0.0)
    # 10 tokens: steep 0->2 (9/token), 2->4 (5), then flat 0->2 (1), 2->4 (1); steep's 4->8 (0.1) fits no more
    assert allocate([40, 40, 40], [zero, flat, steep], 10) == [0, 4, 4]
    # uncacheable segments (None) take nothing; the zero-gain one only once the others are whole
    assert allocate([40, 5, 40], [zero, None, flat], 40) == [0, 0, 40]
    assert allocate([40, 5, 40], [zero, None, flat], 80) == [40, 0, 40]
    for budget in range(0, 130, 7):
        got = allocate([40, 33, 60], [flat, steep, flat], budget)
        assert sum(got) <= budget
        assert got == allocate([40, 33, 60], [flat, steep, flat], budget)  # deterministic


def test_profile_is_zero_without_context_change_and_deterministic():
    model, _, _ = make_model("qwen3_5_text")
    seg = rand_tokens(40, 5)
    ctx = rand_tokens(12, 6)
    p = measure_profile(model, seg, ctx)
    assert len(p.dev) == 40 and all(d > 0 for d in p.dev)
    assert p == measure_profile(model, seg, ctx)
    assert measure_profile(model, seg, []).dev == pytest.approx([0.0] * 40, abs=1e-5)


@pytest.mark.parametrize(
    "arch",
    ["qwen3_5_text", "llama", "lfm2", "granitemoehybrid", "minimax", "kimi_linear", "bailing_moe_linear", "falcon_h1"],
)
def test_budget_covering_whole_segments_equals_full_recompute(arch):
    eng = engine(arch, 1.0)
    plan = Plan(docs())
    full = eng.prepare(plan, mode="full_recompute")
    auto = eng.prepare(plan, mode="hypic", seam="auto")
    assert auto.cached_tokens == 0 and all(u.id is None for u in auto.segments)
    assert (auto.state.last_logits - full.state.last_logits).abs().max().item() < 1e-5


def test_auto_is_deterministic_and_inside_the_budget():
    eng = engine("qwen3_5_text", 0.1)
    plan = Plan(docs())
    p = eng.pieces(plan, mode="hypic", seam="auto")
    seams, keys = eng.seams_and_keys(p, "default")
    assert seams[0] == 0  # nothing before the first segment: its cached rows are exact
    assert all(w == 0 or w >= 3 for w in seams)  # a hybrid's seams cover the conv window (kernel 4)
    assert sum(seams) <= int(0.1 * sum(len(s) for s in p.segs))
    assert sum(seams) > 0
    assert eng.seams_and_keys(p, "default") == (seams, keys)
    a = eng.prepare(plan, mode="hypic", seam="auto")
    b = eng.prepare(plan, mode="hypic", seam="auto")  # now from the cache
    assert torch.equal(a.state.last_logits, b.state.last_logits)
    assert b.cached_tokens == sum(len(s) - w for s, w in zip(p.segs, seams, strict=True))
    # an auto width equal to a fixed seam shares its entry: keys carry absolute widths
    fixed = eng.pieces(plan, mode="hypic", seam=float(seams[1]) if seams[1] > 1 else 0.0)
    assert eng.seams_and_keys(fixed, "default")[1][1] == keys[1]


def test_profile_under_a_build_context_measures_the_rows_the_entry_holds():
    """Entries built after a context cache the rows a segment has after it: the profile compares
    ``[build | seg]`` with ``[build | ctx | seg]``, not the isolated rows, and the engine measures it
    so under ``build_prefix``."""
    model, _, _ = make_model("qwen3_5_text")
    seg, ctx, build = rand_tokens(40, 5), rand_tokens(12, 6), rand_tokens(10, 7)
    iso, under = measure_profile(model, seg, ctx), measure_profile(model, seg, ctx, build)
    assert len(under.dev) == 40 and all(d > 0 for d in under.dev)
    assert max(abs(a - b) for a, b in zip(iso.dev, under.dev, strict=True)) > 1e-3
    assert measure_profile(model, seg, [], build).dev == pytest.approx([0.0] * 40, abs=1e-5)
    eng = Engine(model, tiny_tokenizer(), "t", Settings(min_cached_tokens=4, seam_budget=0.1, build_prefix="template"))
    plan = Plan(docs())
    p = eng.pieces(plan, mode="hypic", seam="auto")
    eng.seams_and_keys(p, "default")
    proxy, tokens = eng.seams.profiles.context(eng.tokenizer), eng.build_context().tokens
    key = eng.entry_key(p.segs[1], "default", 0)
    assert eng.seams.profiles.get(key) == measure_profile(model, p.segs[1], proxy, tokens)
    assert eng.seams_and_keys(p, "default")[0][0] == 0  # the first segment: built alone, exact, no seam


def test_validate_seam_accepts_auto_only_as_a_word():
    assert validate_seam("auto") == "auto"
    with pytest.raises(InvalidRequestError):
        validate_seam("wide")  # type: ignore[arg-type]
