"""Build context (``runtime.hypic.build_context``): segments prefilled after fixed prefix tokens.

Exactness: an entry built after prefix P and reused right after P (w = 0) is the one-pass prefill
of ``P + segment``: its pairs cover the segment's body only (a pair holding the prefix would apply
it twice), its key rows sit at local positions 0..n-1 (re-rotation puts them at P's end), and its
conv tail is the segment's own.
"""

from __future__ import annotations

import pytest
import torch

from hypic_agent.config import Settings
from hypic_agent.errors import ModelConfigError
from hypic_agent.runtime.engine import Engine
from hypic_agent.runtime.hypic.build import ColdBatch, build_entries
from hypic_agent.runtime.hypic.build_context import (
    FILLER,
    NO_CONTEXT,
    BuildContext,
    key_fingerprint,
    resolve_build_context,
)
from hypic_agent.runtime.hypic.combine import combine
from hypic_agent.runtime.hypic.entry import LinearEntry
from hypic_agent.runtime.hypic.layout import plan_layout
from hypic_agent.runtime.hypic.modes import mode_spec
from hypic_agent.runtime.models.loading.tokenizer import tiny_tokenizer
from hypic_agent.runtime.runner.standalone import prefill
from hypic_agent.segments.prompt.framing import header_block

from .conftest import Plan, Seg, make_model, rand_tokens

CPU = torch.device("cpu")
PREFIX = (257, 115, 121, 115)  # <|im_start|>sys


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return (a.float() - b.float()).abs().max().item() if a.numel() else 0.0


@pytest.mark.parametrize("arch", ["qwen3_5_text", "llama", "bailing_moe_linear", "lfm2"])
@pytest.mark.parametrize("fused_cold", [False, True])
def test_entry_reused_right_after_its_prefix_is_exact(arch, fused_cold):
    """[P (recomputed)][C (entry built after P, w = 0)][suffix] == one pass over P + C + suffix;
    the same entry built in isolation is far off (so the test sees the prefix)."""
    model, _, _ = make_model(arch)
    seg, suffix = tuple(rand_tokens(37, 11)), rand_tokens(6, 12)
    segs = [PREFIX, seg]
    full = prefill(model, [[*PREFIX, *seg, *suffix]])[0]
    spec = mode_spec("hypic")
    if fused_cold:  # built inside the combine forward
        batch = ColdBatch(model, [seg], [0], prefix=PREFIX)
        entries = [None, batch.entries[0]]
        got = combine(model, plan_layout(segs, entries, [0, 0], suffix, CPU), entries, spec, cold=batch)
    else:
        entries = [None, build_entries(model, [seg], [0], prefix=PREFIX)[0]]
        got = combine(model, plan_layout(segs, entries, [0, 0], suffix, CPU), entries, spec)
    assert _max_diff(got.last_logits, full.last_logits) < 1e-4
    for a, b in zip(got.layers, full.layers, strict=True):
        for ta, tb in zip(vars(a).values(), vars(b).values(), strict=True):
            assert _max_diff(ta, tb) < 1e-4
    isolated = [None, build_entries(model, [seg], [0])[0]]
    off = combine(model, plan_layout(segs, isolated, [0, 0], suffix, CPU), isolated, spec)
    assert _max_diff(off.last_logits, full.last_logits) > 1e-2


@pytest.mark.parametrize("arch", ["qwen3_5_text", "llama"])
def test_whole_segment_seams_with_a_prefix_equal_full_recompute(arch):
    model, _, _ = make_model(arch)
    segs = [tuple(rand_tokens(n, 20 + i)) for i, n in enumerate((30, 41, 26))]
    suffix = rand_tokens(6, 99)
    seams = [len(s) for s in segs]
    entries = build_entries(model, segs, seams, prefix=PREFIX)
    got = combine(model, plan_layout(segs, entries, seams, suffix, CPU), entries, mode_spec("hypic"))
    full = prefill(model, [[t for s in segs for t in s] + suffix])[0]
    assert _max_diff(got.last_logits, full.last_logits) < 1e-4
    for a, b in zip(got.layers, full.layers, strict=True):
        for ta, tb in zip(vars(a).values(), vars(b).values(), strict=True):
            assert _max_diff(ta, tb) < 1e-4


def test_layer0_pairs_are_the_body_s_own_and_deeper_layers_see_the_prefix():
    """Layer 0's inputs do not depend on the prefix once the seam covers the conv window (w >= W-1):
    its pair and tail equal the isolated build's. Deeper layers' pairs differ (their inputs do)."""
    model, _, _ = make_model("qwen3_5_text")
    segs = [tuple(rand_tokens(n, 40 + i)) for i, n in enumerate((30, 19))]
    with_prefix = build_entries(model, segs, [4, 4], prefix=PREFIX)
    isolated = build_entries(model, segs, [4, 4])
    lin = [i for i, x in enumerate(isolated[0].layers) if isinstance(x, LinearEntry)]
    assert lin[0] == 0 and len(lin) > 1
    for e, r in zip(with_prefix, isolated, strict=True):
        assert e.n_tokens == r.n_tokens and e.seam == r.seam
        a, b = e.layers[0], r.layers[0]
        assert isinstance(a, LinearEntry) and isinstance(b, LinearEntry)
        for ta, tb in ((a.T, b.T), (a.S, b.S), (a.conv_tail, b.conv_tail)):
            assert _max_diff(ta, tb) < 1e-5
        deep_a, deep_b = e.layers[lin[1]], r.layers[lin[1]]
        assert isinstance(deep_a, LinearEntry) and isinstance(deep_b, LinearEntry)
        assert _max_diff(deep_a.S, deep_b.S) > 1e-3
    for e in with_prefix:  # attention rows: the segment's only
        k = next(x for x in e.layers if not isinstance(x, LinearEntry)).k
        assert k.shape[0] == e.n_tokens


def test_short_segment_tail_has_zeros_before_the_segment_and_builds_are_deterministic():
    model, _, _ = make_model("qwen3_5_text")
    segs = [(5, 6), tuple(rand_tokens(20, 3))]  # 2 tokens < W-1 = 3
    a = build_entries(model, segs, [0, 2], prefix=PREFIX)
    b = build_entries(model, segs, [0, 2], prefix=PREFIX)
    iso = build_entries(model, segs, [0, 2])
    tail, tail_iso = a[0].layers[0].conv_tail, iso[0].layers[0].conv_tail  # type: ignore[union-attr]
    assert torch.equal(tail[:, 0], torch.zeros_like(tail[:, 0]))
    assert _max_diff(tail, tail_iso) < 1e-6  # layer 0: the same conv inputs, zeros before them
    for x, y in zip(a, b, strict=True):
        for la, lb in zip(x.layers, y.layers, strict=True):
            for ta, tb in zip(vars(la).values(), vars(lb).values(), strict=True):
                assert torch.equal(ta, tb)


def test_contexts_resolve_and_key_differently():
    tok = tiny_tokenizer()
    tpl = resolve_build_context("template", tok)
    assert tpl.tokens[0] == 257 and bytes(tpl.tokens[1:]).decode() == "system\n"
    assert resolve_build_context("none", tok) == NO_CONTEXT
    with pytest.raises(ModelConfigError):
        resolve_build_context("bos", tok)  # the tiny tokenizer has no BOS token
    fp = "m:float32:abc"
    assert key_fingerprint(fp, NO_CONTEXT) == fp  # isolated entries keep their keys
    keys = {key_fingerprint(fp, c) for c in (NO_CONTEXT, tpl, BuildContext("bos", (1,)), BuildContext("bos", (2,)))}
    assert len(keys) == 4


def test_engine_keys_entries_by_build_context():
    model, _, _ = make_model("qwen3_5_text")
    eng = Engine(model, tiny_tokenizer(), "tiny-test", Settings(min_cached_tokens=4, build_prefix="template"))
    seg = tuple(rand_tokens(24, 7))
    k_tpl = eng.entry_key(seg, "default", 8)
    plan = Plan([Seg(seg), Seg(tuple(rand_tokens(24, 8)))])
    first = eng.prepare(plan, mode="hypic", seam=8)
    again = eng.prepare(plan, mode="hypic", seam=8)
    assert not any(u.hit for u in first.segments) and all(u.hit for u in again.segments)
    eng.settings.build_prefix = "none"
    assert eng.entry_key(seg, "default", 8) != k_tpl
    iso = eng.prepare(plan, mode="hypic", seam=8)
    # never served the other context's entries; the first segment is built alone under every context
    assert iso.segments[0].hit and not any(u.hit for u in iso.segments[1:])
    assert _max_diff(iso.state.last_logits, again.state.last_logits) > 1e-4


@pytest.mark.parametrize("fuse", [True, False])
def test_the_first_segment_is_built_in_isolation_under_a_context(fuse):
    """Nothing precedes a prompt's first segment: under a build context it is still built alone and
    keyed as without one, so at w=0 a one-segment prompt is ``full_recompute`` (exact, as without a
    context); the later segments' entries follow the context."""
    model, _, _ = make_model("qwen3_5_text")
    eng = Engine(
        model,
        tiny_tokenizer(),
        "tiny-test",
        Settings(min_cached_tokens=4, build_prefix="document", fuse_cold_builds=fuse),
    )
    a, b = tuple(rand_tokens(30, 21)), tuple(rand_tokens(26, 22))
    one = Plan([Seg(a)])
    full = eng.prepare(one, mode="full_recompute")
    hyp = eng.prepare(one, mode="hypic", seam=0)
    assert _max_diff(hyp.state.last_logits, full.state.last_logits) < 1e-4
    p = eng.pieces(Plan([Seg(a), Seg(b)]), mode="hypic", seam=8)
    _, keys = eng.seams_and_keys(p, "default")
    eng.settings.build_prefix = "none"
    iso_keys = eng.seams_and_keys(p, "default")[1]
    assert keys[0] == iso_keys[0] and keys[1] != iso_keys[1]


def test_document_context_is_a_system_turn_then_a_framed_document():
    tok = tiny_tokenizer()
    doc = resolve_build_context("document", tok, "Be brief.")
    text = tok.decode(list(doc.tokens))
    filler = header_block("document", FILLER[1], FILLER[0])
    turn = str(tok.apply_chat_template([{"role": "system", "content": "Be brief."}], tokenize=False))
    assert text == turn + filler and "Be brief." in turn and filler.startswith("Document [Notes]\n")
    other = resolve_build_context("document", tok, "Answer in French.")
    assert (
        other.tokens != doc.tokens
        and other.tokens[-len(tok.encode(filler)) :] == doc.tokens[-len(tok.encode(filler)) :]
    )
    fp = "m:float32:abc"
    assert key_fingerprint(fp, doc) != key_fingerprint(fp, other)  # an entry is served under its own prompt only


def test_engine_rekeys_when_the_build_system_prompt_changes():
    model, _, _ = make_model("qwen3_5_text")
    s = Settings(min_cached_tokens=4, build_prefix="document", build_system_prompt="Be brief.")
    eng = Engine(model, tiny_tokenizer(), "tiny-test", s)
    seg = tuple(rand_tokens(24, 7))
    plan = Plan([Seg(seg), Seg(tuple(rand_tokens(24, 8)))])
    k1 = eng.entry_key(seg, "default", 8)
    eng.prepare(plan, mode="hypic", seam=8)
    assert all(u.hit for u in eng.prepare(plan, mode="hypic", seam=8).segments)
    eng.settings.build_system_prompt = "Answer in French."
    assert eng.entry_key(seg, "default", 8) != k1
    again = eng.prepare(plan, mode="hypic", seam=8).segments
    assert again[0].hit and not again[1].hit  # the first segment: built alone, keyed without a context
