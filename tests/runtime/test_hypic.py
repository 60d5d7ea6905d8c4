"""HYPIC exactness on tiny fp32 models: composition, seams, reordering, and the naive ablation."""

from __future__ import annotations

import pytest
import torch

from hypic_agent.errors import UnknownModeError
from hypic_agent.kernels import chain as chain_ops
from hypic_agent.runtime.hypic.build import build_entries
from hypic_agent.runtime.hypic.combine import combine
from hypic_agent.runtime.hypic.layout import plan_layout
from hypic_agent.runtime.hypic.modes import mode_spec, seam_tokens
from hypic_agent.runtime.runner.standalone import prefill

from .conftest import make_model, rand_tokens

CPU = torch.device("cpu")


def compose(model, segs, suffix, mode, w):
    spec = mode_spec(mode)
    seams = [seam_tokens(w if spec.seams else 0, len(s)) for s in segs]
    entries = build_entries(model, segs, seams)
    return combine(model, plan_layout(segs, entries, seams, suffix, CPU), entries, spec), entries


def one_pass(model, segs, suffix):
    return prefill(model, [[t for s in segs for t in s] + suffix])[0]


def kl(p_logits, q_logits):
    p, q = torch.log_softmax(p_logits, -1), torch.log_softmax(q_logits, -1)
    return float((p.exp() * (p - q)).sum())


def segments(lengths=(30, 41, 26), seed=0):
    return [tuple(rand_tokens(n, seed + i)) for i, n in enumerate(lengths)]


@pytest.mark.parametrize(
    "arch", ["qwen3_5_text", "qwen3_next", "llama", "lfm2", "granitemoehybrid", "nemotron_h", "minimax", "falcon_h1"]
)
def test_seam_covering_whole_segments_equals_full_recompute(arch):
    model, _, _ = make_model(arch)
    segs, suffix = segments(), rand_tokens(6, 99)
    st, _ = compose(model, segs, suffix, "hypic", 1.0)
    full = one_pass(model, segs, suffix)
    assert (st.last_logits - full.last_logits).abs().max().item() < 1e-5
    for a, b in zip(st.layers, full.layers):
        for ta, tb in zip(vars(a).values(), vars(b).values()):
            assert torch.allclose(ta, tb, atol=1e-5)


def test_linear_only_with_seams_gives_exact_layer0_state():
    model, _, _ = make_model("qwen3_5_text", slow_decay=True, layer_types=["linear_attention"] * 4)
    segs, suffix = segments(), rand_tokens(5, 98)
    full = one_pass(model, segs, suffix)
    for w in (3, 8):  # seam >= conv kernel - 1
        st, _ = compose(model, segs, suffix, "hypic", w)
        ref = full.layers[0].recurrent
        rel = ((st.layers[0].recurrent - ref).norm() / ref.norm()).item()
        assert rel <= 1e-5, (w, rel)
        assert torch.allclose(st.layers[0].conv, full.layers[0].conv, atol=1e-6)


def test_composed_pairs_equal_one_pass_state_at_layer0():
    """Composition of body pairs (no seams) is exact where layer inputs are exact: layer 0 when
    each segment's conv window is its own (seam >= W-1 at every boundary)."""
    model, _, _ = make_model("qwen3_5_text", slow_decay=True)
    segs = segments((20, 20, 20))
    seams = [3, 3, 3]
    entries = build_entries(model, segs, seams)
    # state of segment seams computed by a one-pass prefill restricted to layer 0 is the reference
    full = one_pass(model, segs, [1, 2])
    st = combine(model, plan_layout(segs, entries, seams, [1, 2], CPU), entries, mode_spec("hypic"))
    ref = full.layers[0].recurrent
    assert ((st.layers[0].recurrent - ref).norm() / ref.norm()).item() <= 1e-5


def test_reordering_reuses_every_entry_and_stays_close():
    model, _, _ = make_model("qwen3_5_text")
    segs, suffix = segments(), rand_tokens(6, 97)
    seams = [8, 8, 8]
    entries = build_entries(model, segs, seams)
    by_tokens = {e.token_ids: e for e in entries}
    order = [2, 0, 1]
    re_segs = [segs[i] for i in order]
    re_entries = [by_tokens[s] for s in re_segs]  # every entry reused, none rebuilt
    st = combine(model, plan_layout(re_segs, re_entries, seams, suffix, CPU), re_entries, mode_spec("hypic"))
    full = one_pass(model, re_segs, suffix)
    assert kl(full.last_logits, st.last_logits) < 0.05


def test_addition_is_far_off_and_transition_is_not():
    model, _, _ = make_model("qwen3_5_text", slow_decay=True, layer_types=["linear_attention"] * 4)
    with torch.no_grad():  # identity conv: no cross-segment conv effect, so T_C alone decides
        for layer in model.layers:
            w = layer.linear_attn.conv1d.weight
            w.zero_()
            w[..., -1] = 1.0
    segs, suffix = segments(), rand_tokens(5, 96)
    full = one_pass(model, segs, suffix)
    ref = full.layers[0].recurrent
    add, _ = compose(model, segs, suffix, "addition", 0)
    tr, _ = compose(model, segs, suffix, "transition", 0)
    err_add = ((add.layers[0].recurrent - ref).norm() / ref.norm()).item()
    err_tr = ((tr.layers[0].recurrent - ref).norm() / ref.norm()).item()
    # naive addition drops T_C: the state is structurally wrong, by a large margin
    assert err_add > 0.2, err_add
    assert err_tr < 1e-5, (err_tr, err_add)


def test_chain_scan_matches_loop():
    g = torch.Generator().manual_seed(0)
    h0 = torch.randn(4, 8, 6, generator=g)
    T = torch.randn(5, 4, 8, 8, generator=g) * 0.3
    S = torch.randn(5, 4, 8, 6, generator=g)
    states = chain_ops.chain_scan(h0, T, S)
    h = h0
    for i in range(5):
        h = T[i] @ h + S[i]
        assert torch.allclose(states[i + 1], h, atol=1e-5)


def test_bad_inputs():
    with pytest.raises(UnknownModeError):
        mode_spec("fastest")
    assert seam_tokens(8, 5) == 5  # a segment shorter than its seam is recomputed whole
    assert seam_tokens(0.25, 10) == 3 and seam_tokens(0, 10) == 0
    model, _, _ = make_model("qwen3_5_text")
    with pytest.raises(ValueError):
        build_entries(model, [()], [0])
    # a segment entirely inside its seam: no body, identical to one pass
    segs, suffix = [tuple(rand_tokens(4, 1)), tuple(rand_tokens(30, 2))], rand_tokens(3, 3)
    st, _ = compose(model, segs, suffix, "hypic", 8)
    assert st.length == 37


@pytest.mark.parametrize("mode,w", [("hypic", 8), ("hypic", 0.5), ("transition", 0), ("addition", 0)])
def test_fused_scan_equals_chunked_combine(mode, w):
    """The fused combine scan (torch twin here; Triton on CUDA) and the chunked path agree."""
    model, _, _ = make_model("qwen3_5_text")
    spec = mode_spec(mode)
    segs = segments((30, 5, 41, 26))  # the 5-token segment is below the seam: recomputed whole
    seams = [seam_tokens(w if spec.seams else 0, len(s)) for s in segs]
    entries = build_entries(model, segs, seams)
    entries[1] = None
    lay = plan_layout(segs, entries, seams, rand_tokens(6, 99), CPU)
    fused = combine(model, lay, entries, spec, fused_scan=True)
    chunked = combine(model, lay, entries, spec, fused_scan=False)
    assert (fused.last_logits - chunked.last_logits).abs().max().item() < 1e-4
    for a, b in zip(fused.layers, chunked.layers):
        for ta, tb in zip(vars(a).values(), vars(b).values()):
            assert torch.allclose(ta, tb, atol=1e-4)


def test_scan_tables_from_cached_entry_pointers_equal_the_chain_tables():
    """The fused scan's tables come from each entry's cached pair pointers: the same tables as built
    link by link from the chains, and an entry whose pairs moved devices is refused."""
    from hypic_agent.kernels.combine_scan import chain_tables
    from hypic_agent.runtime.hypic.combine_inputs import chain_links, pair_tables

    model, _, _ = make_model("qwen3_5_text")
    segs = [rand_tokens(n, 20 + n) for n in (12, 9, 15)]
    seams = [3, 0, 4]
    entries = build_entries(model, segs, seams)
    lay = plan_layout(segs, [entries[0], None, entries[2]], seams, rand_tokens(5, 7), CPU)
    lin = [i for i, layer in enumerate(model.layers) if layer.linear_attn is not None]
    got = pair_tables(lay, [entries[0], None, entries[2]], CPU, len(lin))
    ref = chain_tables([chain_links(lay, [entries[0], None, entries[2]], li) for li in lin], CPU)
    assert torch.equal(got.meta, ref.meta) and torch.equal(got.ptrs, ref.ptrs) and got.pair_dtype == ref.pair_dtype
    assert entries[0].pair_pointers() is entries[0].pair_pointers()  # cached per entry
    with pytest.raises(ValueError, match="on meta"):
        pair_tables(lay, [entries[0], None, entries[2]], torch.device("meta"), len(lin))


@pytest.mark.parametrize(
    "arch",
    ["qwen3_5_moe_text", "qwen3_next", "llama", "lfm2", "granitemoehybrid", "nemotron_h", "minimax", "falcon_h1"],
)
@pytest.mark.parametrize("fused_scan", [True, False])
def test_cold_segments_built_inside_the_combine_equal_build_then_combine(arch, fused_scan):
    """Cold segments built in the combine forward (``combine(..., cold=ColdBatch)``) give the same
    logits, states and entries as ``build_entries`` followed by ``combine``."""
    from hypic_agent.runtime.hypic.build import ColdBatch

    model, _, _ = make_model(arch)
    spec = mode_spec("hypic")
    segs = segments((30, 5, 41, 26, 19), seed=3)
    seams = [seam_tokens(4, len(s)) for s in segs]
    warm = build_entries(model, [segs[0], segs[3]], [seams[0], seams[3]])
    cold_idx = [2, 4]  # segment 1 (5 tokens) stays uncached: recomputed whole
    suffix = rand_tokens(6, 98)

    ref_cold = build_entries(model, [segs[i] for i in cold_idx], [seams[i] for i in cold_idx])
    ref_entries = [warm[0], None, ref_cold[0], warm[1], ref_cold[1]]
    ref = combine(model, plan_layout(segs, ref_entries, seams, suffix, CPU), ref_entries, spec, fused_scan=fused_scan)

    batch = ColdBatch(model, [segs[i] for i in cold_idx], [seams[i] for i in cold_idx])
    entries = [warm[0], None, batch.entries[0], warm[1], batch.entries[1]]
    lay = plan_layout(segs, entries, seams, suffix, CPU)
    got = combine(model, lay, entries, spec, fused_scan=fused_scan, cold=batch)

    assert (got.last_logits - ref.last_logits).abs().max().item() < 1e-4
    for a, b in zip(got.layers, ref.layers, strict=True):
        for ta, tb in zip(vars(a).values(), vars(b).values(), strict=True):
            assert torch.allclose(ta, tb, atol=1e-4)
    for e, r in zip(batch.entries, ref_cold, strict=True):
        assert e.token_ids == r.token_ids and e.seam == r.seam
        for la, lb in zip(e.layers, r.layers, strict=True):
            for ta, tb in zip(vars(la).values(), vars(lb).values(), strict=True):
                assert ta.shape == tb.shape and torch.allclose(ta, tb, atol=1e-5)


@pytest.mark.parametrize("mode", ["transition", "addition"])
@pytest.mark.parametrize("fused_scan", [True, False])
def test_cold_segments_at_the_head_of_a_w0_prompt(mode, fused_scan):
    """A w = 0 prompt whose first segments are cold and built inside the combine: their pairs exist
    only once their layer has run, so the bodies composed before the forward must stop at the first
    cold one. Same logits and states as build-then-combine."""
    from hypic_agent.runtime.hypic.build import ColdBatch

    model, _, _ = make_model("qwen3_5_text")
    spec = mode_spec(mode)
    segs = segments((30, 41, 26, 19), seed=5)
    seams = [0, 0, 0, 0]
    suffix = rand_tokens(6, 97)
    for cold_idx, warm_idx in (([0, 2], [1, 3]), ([2, 3], [0, 1])):  # cold first; warm first, then cold
        warm = build_entries(model, [segs[i] for i in warm_idx], [0, 0])
        ref_cold = build_entries(model, [segs[i] for i in cold_idx], [0, 0])
        ref_entries: list = [None] * 4
        entries: list = [None] * 4
        batch = ColdBatch(model, [segs[i] for i in cold_idx], [0, 0])
        for j, i in enumerate(warm_idx):
            ref_entries[i] = entries[i] = warm[j]
        for j, i in enumerate(cold_idx):
            ref_entries[i], entries[i] = ref_cold[j], batch.entries[j]
        lay_ref, lay = (plan_layout(segs, e, seams, suffix, CPU) for e in (ref_entries, entries))
        ref = combine(model, lay_ref, ref_entries, spec, fused_scan=fused_scan)
        got = combine(model, lay, entries, spec, fused_scan=fused_scan, cold=batch)
        assert (got.last_logits - ref.last_logits).abs().max().item() < 1e-4, cold_idx
        for a, b in zip(got.layers, ref.layers, strict=True):
            for ta, tb in zip(vars(a).values(), vars(b).values(), strict=True):
                assert torch.allclose(ta, tb, atol=1e-4), cold_idx
