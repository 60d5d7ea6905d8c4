"""Edge limits (issue 22): text refused before tokenizing, metadata limits, the edges of the ranges."""

from __future__ import annotations

from tests.api.conftest import PARIS, doc, err, state, store_snapshot


def _count_encodes(monkeypatch, client) -> list[int]:
    tok = state(client).engine.tokenizer
    calls: list[int] = []
    real = tok.encode

    def counting(text, *a, **kw):
        calls.append(len(text))
        return real(text, *a, **kw)

    monkeypatch.setattr(tok, "encode", counting)
    return calls


def test_text_too_long_is_refused_before_tokenizing(make_client, monkeypatch):
    c = make_client(text_chars_per_token=2)
    limit = state(c).engine.max_context * 2
    calls = _count_encodes(monkeypatch, c)
    before = store_snapshot(c)
    long_text = "word " * (limit // 5 + 1)

    r = c.post("/v1/generate", json={"segments": [doc(long_text)], "query": "q", "max_tokens": 1})
    assert r.status_code == 400 and err(r)["type"] == "context_length_exceeded" and err(r)["param"] == "segments"
    assert f"({limit})" in err(r)["message"]
    # split over two segments and the query, the prompt as a whole is still too long
    half = long_text[: len(long_text) // 2]
    r = c.post("/v1/generate", json={"segments": [doc(half), doc(half + "x")], "query": "q" * 10})
    assert r.status_code == 400 and err(r)["type"] == "context_length_exceeded"
    r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": long_text}]})
    assert r.status_code == 400 and err(r)["type"] == "context_length_exceeded"
    r = c.put("/v1/segments", json={"segments": [doc(PARIS), doc(long_text)]})
    assert r.status_code == 400 and err(r)["param"] == "segments.1"
    assert calls == []  # the tokenizer never saw any of them
    assert store_snapshot(c) == before

    # under the limit, text reaches the tokenizer as before
    r = c.put("/v1/segments", json={"segments": [doc(half[:200]), doc(PARIS)]})
    assert r.status_code == 200, r.text
    assert calls


def test_metadata_at_the_limits_is_stored(make_client):
    c = make_client(max_metadata_depth=3, max_metadata_bytes=64)
    ok = {"a": {"b": [1, 2.5, "x"]}}  # 3 levels
    r = c.put("/v1/segments", json={"segments": [doc(PARIS, metadata=ok)]})
    assert r.status_code == 200 and r.json()["data"][0]["metadata"] == ok
    r = c.put("/v1/segments", json={"segments": [doc(PARIS + " 2", metadata={"a": {"b": [[1]]}})]})
    assert r.status_code == 400 and "4 levels" in err(r)["message"] and err(r)["param"] == "segments.0.metadata"
    r = c.put("/v1/segments", json={"segments": [doc(PARIS + " 3", metadata={"k": "v" * 60})]})
    assert r.status_code == 400 and "the limit is 64" in err(r)["message"]
    assert [d["metadata"] for d in c.get("/v1/segments").json()["data"]] == [ok]


def test_row_with_unservable_metadata_does_not_break_listing(client):
    """A row stored before the limit (300 levels deep) is listed with its metadata left out."""
    [d] = client.put("/v1/segments", json={"segments": [doc(PARIS, metadata={"k": 1})]}).json()["data"]
    reg = state(client).store.registry
    deep: dict = {"a": 1}
    for _ in range(300):
        deep = {"a": deep}
    reg.upsert(reg.get(d["id"]).replace(meta=deep))
    r = client.get("/v1/segments")
    assert r.status_code == 200 and r.json()["data"][0]["id"] == d["id"] and r.json()["data"][0]["metadata"] == {}
    assert client.get(f"/v1/segments/{d['id']}").status_code == 200
    assert client.delete(f"/v1/segments/{d['id']}").status_code == 200


def test_edges_of_the_ranges_are_accepted(client):
    q = {"query": "hello", "max_tokens": 2}
    for extra in ({"temperature": 1e-3, "seed": 2**64 - 1}, {"temperature": 5, "top_p": 1e-9, "top_k": 2**31 - 1}):
        r = client.post("/v1/generate", json={**q, **extra})
        assert r.status_code == 200, (extra, r.text)
    assert client.post("/v1/generate", json={**q, "temperature": 5.01}).status_code == 400
    assert client.get(f"/v1/segments?after={2**63 - 1}").status_code == 200
    r = client.post("/v1/generate", json={**q, "stop": ["x"] * 17})
    assert r.status_code == 400 and err(r)["param"] == "stop"
