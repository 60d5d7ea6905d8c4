"""API keys -> tenants: isolation (no get / list / delete / use / hit across tenants), 401, 429."""

from __future__ import annotations

import pytest

from tests.api.conftest import PARIS, doc, err, store_snapshot

KEYS = {"key-alice": "alice", "key-bob": "bob"}
A = {"Authorization": "Bearer key-alice"}
B = {"X-API-Key": "key-bob"}


@pytest.fixture
def auth_client(make_client):
    return make_client(api_keys=KEYS)


def test_missing_or_unknown_key_is_401(auth_client):
    for headers in ({}, {"Authorization": "Bearer nope"}):
        r = auth_client.get("/v1/segments", headers=headers)
        assert r.status_code == 401 and err(r)["type"] == "unauthorized"
    assert auth_client.get("/health").status_code == 200  # probes stay open
    assert auth_client.get("/v1/models", headers=A).status_code == 200


def test_tenant_b_cannot_see_use_delete_or_hit_a(auth_client):
    c = auth_client
    [a] = c.put("/v1/segments", json={"segments": [doc(PARIS, "Paris")]}, headers=A).json()["data"]
    before = store_snapshot(c)

    r = c.get(f"/v1/segments/{a['id']}", headers=B)
    assert r.status_code == 404 and err(r)["type"] == "segment_not_found"
    assert c.get("/v1/segments", headers=B).json()["data"] == []
    r = c.delete(f"/v1/segments/{a['id']}", headers=B)
    assert r.status_code == 404
    r = c.patch(f"/v1/segments/{a['id']}", json={"cache": {"pin": True}}, headers=B)
    assert r.status_code == 404
    r = c.post("/v1/generate", json={"segments": [{"id": a["id"]}], "query": "q", "max_tokens": 1}, headers=B)
    assert r.status_code == 404 and err(r)["type"] == "segment_not_found"
    assert store_snapshot(c) == before

    # the same text from B is B's own (cold) entry: another id, no hit on A's entry
    r = c.post("/v1/generate", json={"segments": [doc(PARIS, "Paris")], "query": "q", "max_tokens": 1}, headers=B)
    seg = r.json()["usage"]["segments"][0]
    assert seg["hit"] is False and seg["id"] != a["id"] and r.json()["usage"]["cached_tokens"] == 0
    # A still has (and hits) its own entry
    assert c.get(f"/v1/segments/{a['id']}", headers=A).status_code == 200
    r = c.post("/v1/generate", json={"segments": [doc(PARIS, "Paris")], "query": "q", "max_tokens": 1}, headers=A)
    assert r.json()["usage"]["segments"][0]["hit"] is True
    assert [d["id"] for d in c.get("/v1/segments", headers=A).json()["data"]] == [a["id"]]
    assert [d["id"] for d in c.get("/v1/segments", headers=B).json()["data"]] == [seg["id"]]


def test_per_tenant_rate_limit_is_429(make_client):
    c = make_client(api_keys=KEYS, tenant_requests_per_minute=3)
    for _ in range(3):
        assert c.get("/v1/segments", headers=A).status_code == 200
    r = c.get("/v1/segments", headers=A)
    assert r.status_code == 429 and err(r)["type"] == "rate_limited"
    assert int(r.headers["retry-after"]) >= 1
    assert c.get("/v1/segments", headers=B).status_code == 200  # bob has his own budget
    assert 'hypic_rate_limited_total{tenant="alice"} 1.0' in c.get("/metrics").text
