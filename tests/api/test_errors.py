"""Bad input: every case gets a 4xx with the error envelope, and the store is left unchanged."""

# ruff: noqa: E501  (the case table reads best one case per line)

from __future__ import annotations

import pytest

from tests.api.conftest import BERLIN, PARIS, doc, err, store_snapshot

LIMITS = {"max_segments": 4, "max_body_bytes": 64 * 1024, "max_tokens_limit": 512}


@pytest.fixture
def seeded(make_client):
    """A client whose store already holds two segments (so 'unchanged' means something)."""
    c = make_client(**LIMITS)
    r = c.put("/v1/segments", json={"segments": [doc(PARIS), doc(BERLIN, cache={"pin": True})]})
    assert r.status_code == 200
    c.ids = [d["id"] for d in r.json()["data"]]  # type: ignore[attr-defined]
    return c


def _gen(**body):
    return {"segments": [doc(PARIS)], "query": "q?", "max_tokens": 2, **body}


def _raw(body: str):
    """A body Python's JSON parser takes but ``json=`` cannot send (NaN, Infinity, lone surrogates)."""
    return {"content": body.encode("utf-8", "surrogatepass"), "headers": {"content-type": "application/json"}}


DEEP = {"a": 1}
for _ in range(300):
    DEEP = {"a": DEEP}
DEEP_SCHEMA: dict = {"type": "string"}
for _ in range(20):  # 40 JSON levels
    DEEP_SCHEMA = {"type": "object", "properties": {"a": DEEP_SCHEMA}}
_HI = [{"role": "user", "content": "hi"}]
_CALL = '{"role": "assistant", "content": "", "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": "{\\"a\\": \\"\\\\ud800\\"}"}}]}'


# fmt: off
CASES = [
    # (name, method, path, kwargs, status, type, param)
    ("malformed json", "POST", "/v1/generate", {"content": b'{"segments": [', "headers": {"content-type": "application/json"}}, 400, "invalid_json", None),
    ("not an object", "POST", "/v1/generate", {"json": [1, 2]}, 400, "invalid_json", None),
    ("no body", "POST", "/v1/generate", {}, 400, "invalid_json", None),
    ("unknown kind", "POST", "/v1/generate", {"json": _gen(segments=[{"kind": "poem", "text": "roses"}])}, 422, "unknown_kind", "segments.0.kind"),
    ("empty segments, no query", "POST", "/v1/generate", {"json": {"segments": [], "max_tokens": 2}}, 400, "invalid_request", "segments"),
    ("empty text", "POST", "/v1/generate", {"json": _gen(segments=[{"kind": "document", "text": "  "}])}, 422, "invalid_request", "segments.0"),
    ("unknown id", "POST", "/v1/generate", {"json": _gen(segments=[{"id": "0" * 32}])}, 404, "segment_not_found", "id"),
    ("too many segments", "POST", "/v1/generate", {"json": _gen(segments=[doc(f"document number {i}") for i in range(5)])}, 400, "too_many_segments", "segments"),
    ("over context window", "POST", "/v1/generate", {"json": _gen(segments=[doc("x" * 5000)])}, 400, "context_length_exceeded", "segments"),
    ("oversized body", "POST", "/v1/generate", {"json": _gen(segments=[doc("y" * 70_000)])}, 413, "payload_too_large", None),
    ("temperature", "POST", "/v1/generate", {"json": _gen(temperature=-1)}, 400, "invalid_request", "temperature"),
    ("top_p", "POST", "/v1/generate", {"json": _gen(top_p=0)}, 400, "invalid_request", "top_p"),
    ("max_tokens zero", "POST", "/v1/generate", {"json": _gen(max_tokens=0)}, 400, "invalid_request", "max_tokens"),
    ("max_tokens over limit", "POST", "/v1/generate", {"json": _gen(max_tokens=10_000)}, 400, "invalid_request", "max_tokens"),
    ("empty stop", "POST", "/v1/generate", {"json": _gen(stop=[""])}, 400, "invalid_request", "stop"),
    ("wrong type", "POST", "/v1/generate", {"json": _gen(max_tokens="many")}, 422, "invalid_request", "max_tokens"),
    ("unknown field", "POST", "/v1/generate", {"json": _gen(temprature=0.5)}, 422, "invalid_request", "temprature"),
    ("unknown mode", "POST", "/v1/generate", {"json": _gen(mode="magic")}, 400, "unknown_mode", "mode"),
    ("bad seam", "POST", "/v1/generate", {"json": _gen(seam=-1)}, 400, "invalid_request", "seam"),
    ("fractional token seam", "POST", "/v1/generate", {"json": _gen(seam=2.5)}, 400, "invalid_request", "seam"),
    ("stream with bad mode", "POST", "/v1/generate", {"json": _gen(mode="magic", stream=True)}, 400, "unknown_mode", "mode"),
    ("put empty", "PUT", "/v1/segments", {"json": {"segments": []}}, 400, "invalid_request", "segments"),
    ("put unknown kind", "PUT", "/v1/segments", {"json": {"segments": [{"kind": "x", "text": "y"}]}}, 422, "unknown_kind", "segments.0.kind"),
    ("put non-composed mode", "PUT", "/v1/segments", {"json": {"segments": [doc(PARIS)], "mode": "full_recompute"}}, 400, "invalid_request", "mode"),
    ("put too many", "PUT", "/v1/segments", {"json": {"segments": [doc(f"d{i}") for i in range(5)]}}, 400, "too_many_segments", "segments"),
    ("get unknown", "GET", "/v1/segments/" + "f" * 32, {}, 404, "segment_not_found", "id"),
    ("delete unknown", "DELETE", "/v1/segments/" + "f" * 32, {}, 404, "segment_not_found", "id"),
    ("patch unknown", "PATCH", "/v1/segments/" + "f" * 32, {"json": {"cache": {"pin": True}}}, 404, "segment_not_found", "id"),
    ("patch bad ttl", "PATCH", "/v1/segments/" + "f" * 32, {"json": {"cache": {"ttl": -5}}}, 422, "invalid_request", "cache.ttl"),
    ("list bad cursor", "GET", "/v1/segments?after=abc", {}, 400, "invalid_request", "cursor"),
    ("list bad limit", "GET", "/v1/segments?limit=0", {}, 422, "invalid_request", "limit"),
    ("chat n=2", "POST", "/v1/chat/completions", {"json": {"messages": [{"role": "user", "content": "hi"}], "n": 2}}, 400, "invalid_request", "n"),
    ("chat image", "POST", "/v1/chat/completions", {"json": {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}}, 400, "invalid_request", "messages.0.content.0"),
    ("chat no messages", "POST", "/v1/chat/completions", {"json": {"messages": []}}, 422, "invalid_request", "messages"),
    ("chat bad role", "POST", "/v1/chat/completions", {"json": {"messages": [{"role": "robot", "content": "x"}]}}, 422, "invalid_request", "messages.0.role"),
    ("chat unknown mode", "POST", "/v1/chat/completions", {"json": {"messages": [{"role": "user", "content": "x"}], "mode": "zz"}}, 400, "unknown_mode", "mode"),
    # values that used to reach the runtime and answer 500 (issue 22)
    ("tiny temperature", "POST", "/v1/generate", {"json": _gen(temperature=1e-39)}, 400, "invalid_request", "temperature"),
    ("nan temperature", "POST", "/v1/generate", _raw('{"query": "q", "temperature": NaN}'), 400, "invalid_request", "temperature"),
    ("seed over 64 bits", "POST", "/v1/generate", {"json": _gen(seed=2**64, temperature=1)}, 400, "invalid_request", "seed"),
    ("negative seed", "POST", "/v1/generate", {"json": _gen(seed=-1)}, 400, "invalid_request", "seed"),
    ("infinite seam", "POST", "/v1/generate", _raw('{"query": "q", "seam": Infinity}'), 400, "invalid_request", "seam"),
    ("put infinite seam", "PUT", "/v1/segments", _raw('{"segments": [{"kind": "document", "text": "x y z"}], "seam": Infinity}'), 400, "invalid_request", "seam"),
    ("huge top_k", "POST", "/v1/generate", {"json": _gen(top_k=2**70)}, 400, "invalid_request", "top_k"),
    ("surrogate query", "POST", "/v1/generate", _raw('{"query": "a\\ud800b"}'), 400, "invalid_request", "query"),
    ("surrogate text", "POST", "/v1/generate", _raw('{"segments": [{"kind": "document", "text": "\\udfff"}], "query": "q"}'), 400, "invalid_request", "segments.0.text"),
    ("surrogate title", "PUT", "/v1/segments", _raw('{"segments": [{"kind": "document", "text": "x y z", "title": "\\ud800"}]}'), 400, "invalid_request", "segments.0.title"),
    ("surrogate metadata key", "PUT", "/v1/segments", _raw('{"segments": [{"kind": "document", "text": "x y z", "metadata": {"a": [{"\\ud800": 1}]}}]}'), 400, "invalid_request", "segments.0.metadata"),
    ("nan in metadata", "PUT", "/v1/segments", _raw('{"segments": [{"kind": "document", "text": "x y z", "metadata": {"a": NaN}}]}'), 400, "invalid_request", "segments.0.metadata"),
    ("surrogate turn", "PUT", "/v1/segments", _raw('{"segments": [{"kind": "turn", "messages": [{"role": "user", "content": "\\ud800"}]}]}'), 400, "invalid_request", "segments.0.messages.0.content"),
    ("surrogate stop", "POST", "/v1/generate", _raw('{"query": "q", "stop": ["ok", "\\ud800"]}'), 400, "invalid_request", "stop.1"),
    ("nul in text", "PUT", "/v1/segments", {"json": {"segments": [doc("a\x00b")]}}, 400, "invalid_request", "segments.0.text"),
    ("surrogate chat", "POST", "/v1/chat/completions", _raw('{"messages": [{"role": "user", "content": "\\ud800"}]}'), 400, "invalid_request", "messages.0.content"),
    ("surrogate chat block", "POST", "/v1/chat/completions", _raw('{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud800"}]}]}'), 400, "invalid_request", "messages.0.content.0.text"),
    ("chat tiny temperature", "POST", "/v1/chat/completions", {"json": {"messages": [{"role": "user", "content": "x"}], "temperature": 1e-30}}, 400, "invalid_request", "temperature"),
    ("deep metadata", "PUT", "/v1/segments", {"json": {"segments": [doc("deep one", metadata=DEEP)]}}, 400, "invalid_request", "segments.0.metadata"),
    ("big metadata", "PUT", "/v1/segments", {"json": {"segments": [doc("big one", metadata={"k": "v" * 20_000})]}}, 400, "invalid_request", "segments.0.metadata"),
    ("generate deep metadata", "POST", "/v1/generate", {"json": _gen(segments=[doc(BERLIN, metadata=DEEP)])}, 400, "invalid_request", "segments.0.metadata"),
    ("infinite ttl", "PUT", "/v1/segments", _raw('{"segments": [{"kind": "document", "text": "x y z", "cache": {"ttl": Infinity}}]}'), 422, "invalid_request", "segments.0.cache.ttl"),
    ("patch infinite ttl", "PATCH", "/v1/segments/" + "f" * 32, _raw('{"cache": {"ttl": Infinity}}'), 422, "invalid_request", "cache.ttl"),
    ("cursor with a superscript digit", "GET", "/v1/segments?after=%C2%B9", {}, 400, "invalid_request", "cursor"),
    ("cursor over 63 bits", "GET", f"/v1/segments?after={2**63}", {}, 400, "invalid_request", "cursor"),
    ("completion surrogate prompt", "POST", "/v1/completions", _raw('{"prompt": "a\\ud800"}'), 400, "invalid_request", "prompt"),
    ("completion tiny temperature", "POST", "/v1/completions", {"json": {"prompt": "x", "temperature": 1e-30}}, 400, "invalid_request", "temperature"),
    ("completion seed over 64 bits", "POST", "/v1/completions", {"json": {"prompt": "x", "seed": 2**64}}, 400, "invalid_request", "seed"),
    ("tool call surrogate", "POST", "/v1/chat/completions", _raw('{"messages": [{"role": "user", "content": "hi"}, ' + _CALL + ', {"role": "user", "content": "x"}]}'), 400, "invalid_request", "messages.1.tool_calls.0.function.arguments"),
    ("tool parameters NaN", "POST", "/v1/chat/completions", _raw('{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": {"x": NaN}}}]}'), 400, "invalid_request", "tools.0.function.parameters"),
    ("deep response schema", "POST", "/v1/chat/completions", {"json": {"messages": _HI, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": DEEP_SCHEMA}}}}, 400, "invalid_request", "response_format.json_schema.schema"),
    ("deep tool parameters", "POST", "/v1/chat/completions", {"json": {"messages": _HI, "tools": [{"type": "function", "function": {"name": "f", "parameters": DEEP_SCHEMA}}]}}, 400, "invalid_request", "tools.0.function.parameters"),
    ("unknown route", "GET", "/v1/nothing", {}, 404, "not_found", None),
    ("wrong method", "DELETE", "/v1/generate", {}, 405, "method_not_allowed", None),
]
# fmt: on


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_4xx_and_store_unchanged(seeded, case):
    _, method, path, kwargs, status, type_, param = case
    before = store_snapshot(seeded)
    r = seeded.request(method, path, **kwargs)
    assert r.status_code == status, r.text
    e = err(r)
    assert e["type"] == type_, e
    if param is not None:
        assert e["param"] == param, e
    assert store_snapshot(seeded) == before


def test_chunked_oversized_body_is_413(seeded):
    def body():
        yield b'{"segments": [{"kind": "document", "text": "'
        for _ in range(80):
            yield b"z" * 1024
        yield b'"}], "query": "q"}'

    before = store_snapshot(seeded)
    r = seeded.post("/v1/generate", content=body(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and err(r)["type"] == "payload_too_large"
    assert store_snapshot(seeded) == before


def test_errors_are_counted_in_metrics(seeded):
    seeded.post("/v1/generate", json=_gen(mode="magic"))
    text = seeded.get("/metrics").text
    assert 'hypic_errors_total{type="unknown_mode"} 1.0' in text


def test_unexpected_exception_is_a_500_envelope_with_request_id(seeded, monkeypatch, caplog):
    """Any bug becomes a logged 500 with the envelope; nothing escapes the app to drop the connection."""
    from fastapi.testclient import TestClient

    from hypic_agent.api import segments_service

    def broken(*_a, **_k):
        raise RuntimeError("a bug")

    monkeypatch.setattr(segments_service, "list_segments", broken)
    strict = TestClient(seeded.app)  # re-raises whatever the app lets out (the lifespan already ran)
    with caplog.at_level("ERROR", logger="hypic.api"):
        r = strict.get("/v1/segments", headers={"x-request-id": "req-42"})
    assert r.status_code == 500 and r.headers["x-request-id"] == "req-42"
    e = err(r)
    assert e["type"] == "internal_error" and "req-42" in e["message"] and "a bug" not in e["message"]
    [rec] = [x for x in caplog.records if x.getMessage().startswith("unhandled error")]
    assert rec.fields["request_id"] == "req-42" and rec.exc_info[0] is RuntimeError  # type: ignore[attr-defined]
    assert strict.get("/v1/segments/" + seeded.ids[0]).status_code == 200  # the app keeps serving
    assert 'hypic_errors_total{type="internal_error"} 1.0' in strict.get("/metrics").text
