"""/v1/segments: register + pre-warm, get, list (paginated), patch pin/TTL, delete, use by id."""

from __future__ import annotations

from tests.api.conftest import BERLIN, PARIS, ROME, doc, state


def put(client, *segments, **kw):
    r = client.put("/v1/segments", json={"segments": list(segments), **kw})
    assert r.status_code == 200, r.text
    return r.json()["data"]


def test_put_prewarms_and_returns_content_ids(client):
    data = put(client, doc(PARIS, "Paris"), {"kind": "skill", "text": "search(query): look things up on the web"})
    assert [d["kind"] for d in data] == ["document", "skill"]
    assert all(len(d["id"]) == 32 and d["tier"] == "cpu" and d["bytes"] > 0 and d["hit"] is False for d in data)
    assert data[0]["title"] == "Paris"
    again = put(client, doc(PARIS, "Paris"))
    assert again[0]["id"] == data[0]["id"] and again[0]["hit"] is True  # content addressed
    # a stored id is a cache hit wherever it is used
    r = client.post(
        "/v1/generate",
        json={"segments": [{"id": data[1]["id"]}, {"id": data[0]["id"]}], "query": "q?", "max_tokens": 2},
    )
    segs = r.json()["usage"]["segments"]
    assert [s["id"] for s in segs] == [data[1]["id"], data[0]["id"]]
    assert all(s["hit"] for s in segs)


def test_get_one_has_text_and_policy(client):
    [d] = put(client, doc(ROME, "Rome", cache={"pin": True, "ttl": 3600}, metadata={"source": "wiki"}))
    r = client.get(f"/v1/segments/{d['id']}")
    assert r.status_code == 200
    info = r.json()
    assert info["pin"] is True and info["ttl"] == 3600 and info["metadata"] == {"source": "wiki"}
    assert ROME in info["text"] and info["tokens"] == d["tokens"]


def test_short_segment_is_registered_without_payload(client):
    [d] = put(client, {"kind": "text", "text": "hi"})  # below min_cached_tokens
    assert d["tier"] == "none" and d["bytes"] == 0
    r = client.post("/v1/generate", json={"segments": [{"id": d["id"]}], "query": "q", "max_tokens": 1})
    assert r.status_code == 200


def test_list_is_paginated_newest_first(client):
    texts = [f"Fact number {i}: the value of item {i} is {i * 7} units in the catalogue." for i in range(5)]
    ids = [put(client, doc(t))[0]["id"] for t in texts]
    r = client.get("/v1/segments", params={"limit": 2})
    page = r.json()
    assert [d["id"] for d in page["data"]] == ids[::-1][:2] and page["has_more"] and page["next"]
    seen = [d["id"] for d in page["data"]]
    while page["has_more"]:
        page = client.get("/v1/segments", params={"limit": 2, "after": page["next"]}).json()
        seen += [d["id"] for d in page["data"]]
    assert seen == ids[::-1]
    kinds = client.get("/v1/segments", params={"kind": "skill"}).json()
    assert kinds["data"] == [] and kinds["has_more"] is False


def test_patch_pin_and_ttl(client):
    [d] = put(client, doc(BERLIN))
    r = client.patch(f"/v1/segments/{d['id']}", json={"cache": {"pin": True, "ttl": 60}})
    assert r.status_code == 200 and r.json()["pin"] is True and r.json()["ttl"] == 60
    r = client.patch(f"/v1/segments/{d['id']}", json={"cache": {"ttl": None}})
    assert r.json()["ttl"] is None and r.json()["pin"] is True
    r = client.patch(f"/v1/segments/{d['id']}", json={"cache": {"pin": False}})
    assert r.json()["pin"] is False


def test_delete_then_unknown(client):
    [d] = put(client, doc(PARIS))
    r = client.delete(f"/v1/segments/{d['id']}")
    assert r.status_code == 200 and r.json() == {"id": d["id"], "object": "segment", "deleted": True}
    assert client.get(f"/v1/segments/{d['id']}").status_code == 404
    assert client.delete(f"/v1/segments/{d['id']}").status_code == 404
    assert state(client).store.stats().entries == 0
    # the same text again is simply recomputed (cold)
    r = client.post("/v1/generate", json={"segments": [doc(PARIS)], "query": "q", "max_tokens": 1})
    assert r.json()["usage"]["segments"][0]["hit"] is False


def test_inline_segments_of_generate_are_listed_and_resolvable(client):
    r = client.post("/v1/generate", json={"segments": [doc(ROME, "Rome")], "query": "q", "max_tokens": 1})
    sid = r.json()["usage"]["segments"][0]["id"]
    info = client.get(f"/v1/segments/{sid}").json()
    assert info["title"] == "Rome" and ROME in info["text"]
    r = client.post("/v1/generate", json={"segments": [{"id": sid}], "query": "q", "max_tokens": 1})
    assert r.json()["usage"]["segments"][0]["hit"] is True


def test_hits_are_in_the_registry_once_answered(client):
    """Not buffered past the response (issue 22: hit counts were lost on kill -9)."""
    [d] = client.put("/v1/segments", json={"segments": [doc(PARIS)]}).json()["data"]
    reg = state(client).store.registry  # read the rows directly: no flush on the way
    for n in (1, 2, 3):
        r = client.post("/v1/generate", json={"segments": [{"id": d["id"]}], "query": "q", "max_tokens": 1})
        assert r.json()["usage"]["segments"][0]["hit"] is True
        assert reg.get(d["id"]).hits == n
    assert state(client).store.flush_interval_s == 2.0  # the store alone would have buffered them
