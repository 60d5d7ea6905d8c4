"""POST /v1/generate: JSON and SSE, per-segment usage, reorder hits, modes, logprobs."""

from __future__ import annotations

from tests.api.conftest import BERLIN, PARIS, ROME, doc, sse_events

SYSTEM = {"kind": "system", "text": "You answer from the documents, briefly and exactly."}


def gen(client, segments, query="What is the capital?", **kw):
    r = client.post("/v1/generate", json={"segments": segments, "query": query, "max_tokens": 4, **kw})
    assert r.status_code == 200, r.text
    return r.json()


def test_json_response_shape_and_usage(client):
    body = gen(client, [SYSTEM, doc(PARIS, "Paris")], logprobs=True)
    assert body["finish_reason"] in ("stop", "length")
    assert body["model"] == "tiny:qwen3_5_text"
    u = body["usage"]
    assert u["prompt_tokens"] == u["cached_tokens"] + u["recomputed_tokens"]
    assert u["cached_tokens"] == 0 and u["exact_prefix_tokens"] == 0  # all cold
    assert [s["kind"] for s in u["segments"]] == ["system", "document"]
    assert all(not s["hit"] and s["tier"] is None and len(s["id"]) == 32 for s in u["segments"])
    assert 0 < u["completion_tokens"] <= 4
    t = body["timings"]
    assert 0 < t["ttft_ms"] <= t["total_ms"]
    assert len(body["logprobs"]) == u["completion_tokens"]
    assert all(lp["logprob"] <= 0 for lp in body["logprobs"])


def test_reordered_segments_hit_and_cached_tokens_rise(client):
    first = gen(client, [SYSTEM, doc(PARIS), doc(BERLIN)])
    again = gen(client, [SYSTEM, doc(BERLIN), doc(PARIS)])  # same segments, other order
    assert first["usage"]["cached_tokens"] == 0
    assert again["usage"]["cached_tokens"] > 0
    segs = again["usage"]["segments"]
    assert all(s["hit"] and s["tier"] == "cpu" for s in segs)
    ids_first = {s["id"] for s in first["usage"]["segments"]}
    assert {s["id"] for s in segs} == ids_first  # position independent ids
    # a composed result is never reported as an exact prefix hit
    assert again["usage"]["exact_prefix_tokens"] == 0 and again["usage"]["mode"] == "hypic"


def test_stream_sse_events_match_json(client):
    segments = [SYSTEM, doc(ROME)]
    plain = gen(client, segments, query="Who founded it?")
    r = client.post(
        "/v1/generate",
        json={"segments": segments, "query": "Who founded it?", "max_tokens": 4, "stream": True, "logprobs": True},
    )
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    final = events[-2]
    deltas = events[:-2]
    assert final["text"] == "" and final["finish_reason"] and "usage" in final and "timings" in final
    assert all({"id", "text", "token_id", "logprob"} <= set(e) for e in deltas)
    assert all(e["id"] == final["id"] for e in deltas)
    assert "".join(e["text"] for e in deltas) == plain["text"]  # greedy: same text
    assert final["usage"]["cached_tokens"] > 0  # the plain call stored the entries
    assert final["usage"]["completion_tokens"] == plain["usage"]["completion_tokens"]


def test_modes_and_prefix_cache_exact_prefix(client):
    segs = [SYSTEM, doc(PARIS), doc(BERLIN)]
    full = gen(client, segs, mode="full_recompute")
    assert full["usage"]["cached_tokens"] == 0 and full["usage"]["mode"] == "full_recompute"
    gen(client, segs, mode="prefix_cache")
    pc = gen(client, segs, mode="prefix_cache")
    assert pc["usage"]["exact_prefix_tokens"] > 0
    assert pc["usage"]["cached_tokens"] == pc["usage"]["exact_prefix_tokens"]
    for mode in ("addition", "transition", "transition_rope", "hypic"):
        body = gen(client, segs, mode=mode)
        assert body["usage"]["mode"] == mode and body["usage"]["exact_prefix_tokens"] == 0


def test_query_only_and_segments_only(client):
    q = gen(client, [], query="Say hi.")
    assert q["usage"]["segments"] == [] and q["usage"]["prompt_tokens"] > 0
    s = gen(client, [doc(PARIS)], query=None)
    assert s["usage"]["segments"][0]["hit"] is False


def test_turn_segments_and_text_kind(client):
    turns = {
        "kind": "turn",
        "messages": [
            {"role": "user", "content": "hi there"},
            {"role": "assistant", "content": "hello, how can I help?"},
        ],
    }
    body = gen(client, [turns, {"kind": "text", "text": "plain text segment that is long enough to be cached"}])
    assert [s["kind"] for s in body["usage"]["segments"]] == ["turn", "text"]
