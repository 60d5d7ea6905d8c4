"""A long segment split into pieces (``Settings.split_segment_tokens``): content-addressed pieces, a
seam at every split, per-segment usage, and answers that differ only by what the seams do."""

from __future__ import annotations

import pytest
import torch

from hypic_agent.config import Settings
from hypic_agent.runtime.engine import Engine
from hypic_agent.runtime.models.loading.tokenizer import tiny_tokenizer
from hypic_agent.runtime.results import SegmentUsage, fold_pieces
from hypic_agent.segments.prompt.split import split_ids, split_segments

from .conftest import Plan, Seg, make_model, rand_tokens

PIECE = 32
QUERY = [5, 6, 7, 8]


def _engine(split: int) -> Engine:
    model, _, _ = make_model("qwen3_5_text")
    return Engine(model, tiny_tokenizer(), "tiny-test", Settings(min_cached_tokens=4, split_segment_tokens=split))


@pytest.fixture(scope="module")
def split() -> Engine:
    return _engine(PIECE)


@pytest.fixture(scope="module")
def whole() -> Engine:
    return _engine(0)


def _doc(n: int, seed: int) -> Seg:
    return Seg(tuple(rand_tokens(n, seed)))


# ---------------------------------------------------------------------- the cut itself (pure)
def test_pieces_are_cut_from_the_start_and_map_back_to_their_segment():
    ids = tuple(range(100))
    assert split_ids(ids, 32) == [ids[0:32], ids[32:64], ids[64:96], ids[96:100]]
    assert split_ids(ids, 100) == [ids] and split_ids(ids, 0) == [ids]
    cut = split_segments([(1,), ids, tuple(range(10))], ["bos", "document", "system"], 32)
    assert [len(p) for p in cut.segs] == [1, 32, 32, 32, 4, 10]
    assert cut.kinds == ["bos"] + ["document"] * 4 + ["system"]
    assert cut.owners == (0, 1, 1, 1, 1, 2) and cut.was_split
    assert split_segments([(1,) * 40], ["bos"], 8).segs == [(1,) * 40]  # kept kinds are never cut
    assert not split_segments([ids], ["document"], 100).was_split
    # a shared prefix gives the same leading pieces whatever follows it
    other = ids[:70] + tuple(range(500, 540))
    assert split_ids(other, 32)[:2] == split_ids(ids, 32)[:2]
    assert split_ids(other, 32)[2] != split_ids(ids, 32)[2]


def test_usage_folds_back_per_segment():
    pieces = [
        SegmentUsage(None, "bos", 1, False, None),
        SegmentUsage("a", "document", 32, True, "gpu"),
        SegmentUsage("b", "document", 32, True, "disk"),
        SegmentUsage(None, "document", 3, False, None),  # a tail too short to cache
        SegmentUsage("c", "system", 10, False, None),
    ]
    bos, doc, system = fold_pieces(pieces, (0, 1, 1, 1, 2))
    assert bos is pieces[0] and system is pieces[4]
    assert (doc.id, doc.kind, doc.tokens, doc.hit, doc.tier) == (None, "document", 67, True, "mixed")
    assert doc.pieces == pieces[1:4]
    half = fold_pieces([pieces[1], SegmentUsage("d", "document", 32, False, None)], (0, 0))[0]
    assert (half.hit, half.tier) == (False, "gpu")
    assert fold_pieces(pieces, ()) == pieces


# ---------------------------------------------------------------------- the engine
def test_with_seams_over_whole_pieces_a_split_request_equals_full_recompute(split):
    plan = Plan([_doc(100, 10), _doc(20, 11), _doc(70, 12)], suffix_ids=QUERY)
    p = split.pieces(plan, mode="hypic", seam=1.0)
    assert [len(s) for s in p.segs] == [32, 32, 32, 4, 20, 32, 32, 6]  # the cut happened
    got = split.prepare(plan, mode="hypic", seam=1.0)  # every piece recomputed in context
    ref = split.prepare(plan, mode="full_recompute")
    torch.testing.assert_close(got.state.last_logits, ref.state.last_logits, rtol=1e-5, atol=1e-5)
    assert got.cached_tokens == 0 and got.recomputed_tokens == 194
    assert [u.tokens for u in got.segments] == [100, 20, 70]
    assert [len(u.pieces) for u in got.segments] == [4, 0, 3]


def test_a_split_document_is_answered_as_its_pieces_sent_as_segments(split, whole):
    doc = _doc(100, 20)
    by_hand = Plan([Seg(p) for p in split_ids(doc.token_ids, PIECE)], suffix_ids=QUERY)
    ref = whole.prepare(by_hand, mode="hypic")
    got = split.prepare(Plan([doc], suffix_ids=QUERY), mode="hypic")
    torch.testing.assert_close(got.state.last_logits, ref.state.last_logits, rtol=0, atol=0)
    assert (got.cached_tokens, got.recomputed_tokens) == (0, 104)
    (u,) = got.segments
    assert [p.id for p in u.pieces] == [s.id for s in ref.segments]  # the same content keys
    # the unsplit document is a different request: one segment, one seam
    unsplit = whole.prepare(Plan([doc], suffix_ids=QUERY), mode="hypic")
    assert not torch.allclose(unsplit.state.last_logits, got.state.last_logits, atol=1e-4)


def test_a_repeated_or_prefix_sharing_document_hits_its_pieces(split):
    doc = _doc(100, 30)
    first = split.prepare(Plan([doc], suffix_ids=QUERY), mode="hypic")
    assert first.cached_tokens == 0 and not first.segments[0].hit
    again = split.prepare(Plan([doc], suffix_ids=QUERY), mode="hypic")
    (u,) = again.segments
    assert u.hit and u.tier == "memory" and u.id is None
    assert [p.hit for p in u.pieces] == [True, True, True, False]  # the 4-token tail is never cached
    assert again.cached_tokens == 3 * (PIECE - 8)  # default seam: 8 tokens recomputed per piece
    assert again.recomputed_tokens == again.prompt_tokens - again.cached_tokens
    torch.testing.assert_close(again.state.last_logits, first.state.last_logits, rtol=0, atol=0)
    # 70 shared tokens, then different ones: the two pieces wholly inside the prefix hit
    other = Seg(doc.token_ids[:70] + tuple(rand_tokens(50, 31)))
    shared = split.prepare(Plan([other], suffix_ids=QUERY), mode="hypic")
    assert [p.hit for p in shared.segments[0].pieces] == [True, True, False, False]
    assert shared.cached_tokens == 2 * (PIECE - 8) and not shared.segments[0].hit


def test_splitting_leaves_non_composed_modes_and_prewarm_agrees(split):
    doc = _doc(90, 40)
    for mode in ("full_recompute", "prefix_cache"):
        p = split.pieces(Plan([doc], suffix_ids=QUERY), mode=mode)
        assert p.segs == [doc.token_ids] and p.owners == ()
    (u,) = split.prewarm([doc.token_ids], ["document"], mode="hypic")
    assert [p.tokens for p in u.pieces] == [32, 32, 26] and not u.hit
    got = split.prepare(Plan([doc], suffix_ids=QUERY), mode="hypic")
    assert got.segments[0].hit and got.cached_tokens == (32 - 8) + (32 - 8) + (26 - 8)  # the pre-warmed pieces


def test_through_the_http_api_a_split_document_is_one_segment_in_the_usage(tmp_path):
    from fastapi.testclient import TestClient

    from hypic_agent.api import create_app

    doc = "Paris is the capital of France. It lies on the Seine and has about two million people. " * 3
    body = {
        "segments": [{"kind": "document", "text": doc}, {"kind": "document", "text": "Rome is in Italy."}],
        "query": "Which river?",
        "max_tokens": 2,
        "temperature": 0,
    }
    settings = Settings(home=tmp_path, device="cpu", model="tiny:qwen3_5_text", split_segment_tokens=16)
    with TestClient(create_app(settings)) as client:
        first, again = (client.post("/v1/generate", json=body).json()["usage"] for _ in range(2))
    n = first["segments"][0]["tokens"]
    assert n > 32 and len(first["segments"]) == len(again["segments"]) == 2  # per request segment, not per piece
    assert first["cached_tokens"] == 0 and not first["segments"][0]["hit"]
    assert again["segments"][0]["hit"] and again["segments"][0]["tier"] is not None
    # every whole 16-token piece of both documents is cached but for its 8-token seam; a shorter tail
    # (< min_cached_tokens) is not
    assert again["cached_tokens"] == sum(u["tokens"] // 16 for u in again["segments"]) * (16 - 8)
    assert again["recomputed_tokens"] == again["prompt_tokens"] - again["cached_tokens"]
