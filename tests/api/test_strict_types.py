"""Strict request types, full ``Allow`` headers and empty queries (issue 38, item 8)."""

from __future__ import annotations

import pytest

from tests.api.conftest import PARIS, doc, err, store_snapshot

Q = {"query": "Which capital?", "max_tokens": 1}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


@pytest.mark.parametrize(
    ("path", "body", "param", "says"),
    [
        ("/v1/generate", {**Q, "max_tokens": "4"}, "max_tokens", 'valid integer, got a string ("4")'),
        ("/v1/generate", {**Q, "max_tokens": True}, "max_tokens", "valid integer, got a boolean (true)"),
        ("/v1/generate", {**Q, "max_tokens": 4.0}, "max_tokens", "valid integer, got a number (4.0)"),
        ("/v1/generate", {**Q, "temperature": "0"}, "temperature", 'valid number, got a string ("0")'),
        ("/v1/generate", {**Q, "top_p": True}, "top_p", "valid number, got a boolean"),
        ("/v1/generate", {**Q, "seed": "1"}, "seed", "valid integer"),
        ("/v1/generate", {**Q, "stream": "yes"}, "stream", 'valid boolean, got a string ("yes")'),
        ("/v1/generate", {**Q, "stream": 1}, "stream", "valid boolean, got an integer (1)"),
        ("/v1/generate", {**Q, "logprobs": "true"}, "logprobs", "valid boolean"),
        ("/v1/generate", {**Q, "seam": "8"}, "seam", "valid number or 'auto' or 'blend'"),
        ("/v1/generate", {**Q, "segments": [doc(PARIS, cache={"pin": "yes"})]}, "segments.0.cache.pin", "boolean"),
        ("/v1/generate", {**Q, "segments": [doc(PARIS, cache={"ttl": "60"})]}, "segments.0.cache.ttl", "number"),
        ("/v1/chat/completions", {**CHAT, "max_tokens": "4"}, "max_tokens", "valid integer"),
        ("/v1/chat/completions", {**CHAT, "temperature": "0"}, "temperature", "valid number"),
        ("/v1/chat/completions", {**CHAT, "stream": "yes"}, "stream", "valid boolean"),
        ("/v1/chat/completions", {**CHAT, "logprobs": "yes"}, "logprobs", "valid boolean"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": "4"}, "max_tokens", "valid integer"),
        ("/v1/completions", {"prompt": "hi", "temperature": True}, "temperature", "valid number"),
        ("/v1/completions", {"prompt": "hi", "stream": "yes"}, "stream", 'valid boolean, got a string ("yes")'),
        ("/v1/completions", {"prompt": "hi", "echo": "yes"}, "echo", 'valid boolean, got a string ("yes")'),
        ("/v1/completions", {"prompt": "hi", "n": "2"}, "n", 'valid integer, got a string ("2")'),
        ("/v1/completions", {"prompt": "hi", "best_of": "1"}, "best_of", "valid integer"),
        ("/v1/completions", {"prompt": "hi", "logprobs": True}, "logprobs", "valid integer, got a boolean"),
        (
            "/v1/completions",
            {"prompt": "hi", "stream_options": {"include_usage": "yes"}},
            "stream_options.include_usage",
            "valid boolean",
        ),
        (
            "/v1/chat/completions",
            {**CHAT, "stream_options": {"include_usage": 1}},
            "stream_options.include_usage",
            "valid boolean",
        ),
    ],
)
def test_strings_and_booleans_for_numbers_or_flags_are_422_naming_the_field(client, path, body, param, says):
    before = store_snapshot(client)
    r = client.post(path, json=body)
    assert r.status_code == 422, r.text
    e = err(r)
    assert e["type"] == "invalid_request" and e["param"] == param, e
    assert e["message"].startswith(f"{param}: ") and says in e["message"], e
    assert store_snapshot(client) == before


@pytest.mark.parametrize(
    ("method", "path", "body", "param"),
    [
        ("put", "/v1/segments", {"segments": [doc(PARIS, cache={"pin": "yes"})]}, "segments.0.cache.pin"),
        ("put", "/v1/segments", {"segments": [doc(PARIS)], "seam": "8"}, "seam"),
        ("patch", "/v1/segments/abc", {"cache": {"pin": "yes"}}, "cache.pin"),
        ("patch", "/v1/segments/abc", {"cache": {"pin": 1}}, "cache.pin"),
        ("patch", "/v1/segments/abc", {"cache": {"ttl": "60"}}, "cache.ttl"),
    ],
)
def test_segment_routes_are_strict_too(client, method, path, body, param):
    before = store_snapshot(client)
    r = getattr(client, method)(path, json=body)
    assert r.status_code == 422 and err(r)["param"] == param, r.text
    assert store_snapshot(client) == before


def test_well_typed_values_still_pass(client):
    body = {**Q, "max_tokens": 2, "temperature": 0, "top_p": 1, "seed": 3, "seam": 8, "stream": False}
    assert client.post("/v1/generate", json=body).status_code == 200
    assert client.post("/v1/generate", json={**body, "temperature": 0.7, "top_p": 0.9, "seam": 0.5}).status_code == 200
    r = client.put("/v1/segments", json={"segments": [doc(PARIS, cache={"pin": True, "ttl": 60})]})
    assert r.status_code == 200 and r.json()["data"][0]["pin"] is True
    sid = r.json()["data"][0]["id"]
    assert client.patch(f"/v1/segments/{sid}", json={"cache": {"pin": False, "ttl": 30}}).json()["ttl"] == 30
    r = client.post("/v1/chat/completions", json={**CHAT, "temperature": 1, "stream": False, "logprobs": True})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("path", "allow"),
    [
        ("/v1/segments/abc", "DELETE, GET, PATCH"),
        ("/v1/segments", "GET, PUT"),
        ("/v1/generate", "POST"),
        ("/v1/chat/completions", "POST"),
        ("/health", "GET"),
    ],
)
def test_405_allow_lists_every_method_of_the_path(client, path, allow):
    for method in ("OPTIONS", "POST" if allow == "GET" else "GET", "HEAD"):
        if method in allow.split(", "):
            continue
        r = client.request(method, path)
        assert r.status_code == 405 and r.headers["allow"] == allow, (method, r.headers)
        if method != "HEAD":
            assert err(r)["type"] == "method_not_allowed" and f"it takes {allow}" in err(r)["message"]


def test_an_empty_query_is_a_prompt(client):
    r = client.post("/v1/generate", json={"query": "", "max_tokens": 2})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] > 0 and r.json()["usage"]["segments"] == []
    r = client.post("/v1/generate", json={"segments": [doc(PARIS)], "query": "", "max_tokens": 2})
    assert r.status_code == 200, r.text
    r = client.post("/v1/generate", json={"segments": [], "max_tokens": 2})  # neither: still refused
    assert r.status_code == 400 and err(r)["param"] == "segments"


def test_an_empty_completion_prompt_is_a_prompt(client, monkeypatch):
    from hypic_agent.api.routes.completions import CompletionRequest, prepare
    from tests.api.conftest import state

    st = state(client)
    tok = st.engine.tokenizer
    assert getattr(tok, "bos_token_id", None) is None  # the tiny tokenizer has none: nothing to start from
    before = store_snapshot(client)
    for prompt in ("", [""]):
        r = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2})
        assert r.status_code == 400, r.text
        e = err(r)
        assert e["param"] == "prompt" and "no BOS token" in e["message"], e
    assert store_snapshot(client) == before
    # with segments, an empty prompt adds nothing: the segments are the prompt
    r = client.post("/v1/completions", json={"prompt": "", "segments": [doc(PARIS)], "max_tokens": 2})
    assert r.status_code == 200, r.text
    job = prepare(st, CompletionRequest(prompt="", segments=[doc(PARIS)]), "default")
    assert [s.kind for s in job.plan.segments] == ["document"] and job.plan.suffix_ids == ()
    # whitespace only is text too (the uncached suffix: no segment holds blank text)
    r = client.post("/v1/completions", json={"prompt": " ", "max_tokens": 2})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len(tok.encode(" ", add_special_tokens=False)) == 1
    # a tokenizer with a BOS token: the prompt is that token alone
    monkeypatch.setattr(type(tok), "bos_token_id", 7, raising=False)
    job = prepare(st, CompletionRequest(prompt=""), "default")
    assert job.plan.token_ids() == [7] and job.plan.segments == ()
    r = client.post("/v1/completions", json={"prompt": "", "max_tokens": 3})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["prompt_tokens"] == 1 and body["choices"][0]["finish_reason"] in ("length", "stop")
