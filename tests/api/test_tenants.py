"""API keys -> tenants: isolation (no get / list / delete / use / hit across tenants), 401, 429,
failed keys per client address, /health and /metrics with keys on."""

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
    assert auth_client.get("/v1/models", headers=A).status_code == 200


def test_health_without_a_key_is_liveness_only(auth_client):
    assert auth_client.get("/health").json() == {"status": "ok"}  # probes stay open, and learn nothing
    full = auth_client.get("/health", headers=A).json()
    assert full["status"] == "ok" and full["model"] == "tiny:qwen3_5_text" and full["auth"] == "api_keys"
    assert set(full["store"]) == {"entries", "bytes"}
    r = auth_client.get("/health", headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401 and err(r)["type"] == "unauthorized"


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
    c = make_client(api_keys=KEYS, tenant_requests_per_minute=3, metrics_tenant_labels=True, metrics_token="m-tok")
    for _ in range(3):
        assert c.get("/v1/segments", headers=A).status_code == 200
    r = c.get("/v1/segments", headers=A)
    assert r.status_code == 429 and err(r)["type"] == "rate_limited"
    assert int(r.headers["retry-after"]) >= 1
    assert c.get("/v1/segments", headers=B).status_code == 200  # bob has his own budget
    text = c.get("/metrics", headers={"Authorization": "Bearer m-tok"}).text
    assert 'hypic_rate_limited_total{tenant="alice"} 1.0' in text


def test_metrics_name_no_tenant_unless_enabled(make_client):
    c = make_client(api_keys=KEYS, tenant_requests_per_minute=1, metrics_token="m-tok")
    c.get("/v1/segments", headers=A)
    assert c.get("/v1/segments", headers=A).status_code == 429
    text = c.get("/metrics", headers={"Authorization": "Bearer m-tok"}).text
    assert "hypic_rate_limited_total 1.0" in text and "alice" not in text and "bob" not in text


def test_metrics_refuse_without_their_token_when_keys_are_on(make_client):
    c = make_client(api_keys=KEYS, metrics_token="m-tok")
    for headers in ({}, A, {"Authorization": "Bearer wrong"}):  # a tenant's key is not the metrics token
        r = c.get("/metrics", headers=headers)
        assert r.status_code == 401 and err(r)["type"] == "unauthorized" and "HYPIC_METRICS_TOKEN" in err(r)["message"]
    r = c.get("/metrics", headers={"Authorization": "Bearer m-tok"})
    assert r.status_code == 200 and "hypic_requests_total" in r.text


def test_metrics_without_a_token_are_closed_with_keys_on(make_client):
    from fastapi.testclient import TestClient

    c = make_client(api_keys=KEYS)
    for client in (c, TestClient(c.app, client=("127.0.0.1", 40000))):  # a loopback peer is no exception
        for headers in ({}, A):  # nor is a tenant's key
            r = client.get("/metrics", headers=headers)
            assert r.status_code == 401 and err(r)["type"] == "unauthorized", r.text
            assert "HYPIC_METRICS_TOKEN" in err(r)["message"] and "HYPIC_METRICS_OPEN" in err(r)["message"]
    assert make_client().get("/metrics").status_code == 200  # no API keys: open as before
    opened = make_client(api_keys=KEYS, metrics_open=True)
    assert opened.get("/metrics").status_code == 200 and "hypic_requests_total" in opened.get("/metrics").text


def test_wrong_keys_get_429_after_the_configured_count_and_valid_keys_still_pass(make_client):
    from fastapi.testclient import TestClient

    c = make_client(api_keys=KEYS, auth_failures_per_minute=3, metrics_token="m-tok")
    now = [1000.0]
    c.app.state.auth_failures.clock = lambda: now[0]
    wrong = {"Authorization": "Bearer guessing-1"}
    assert [c.get("/v1/segments", headers=wrong).status_code for _ in range(3)] == [401, 401, 401]
    r = c.get("/v1/segments", headers=wrong)
    assert r.status_code == 429 and err(r)["type"] == "rate_limited" and int(r.headers["retry-after"]) == 60
    assert c.get("/v1/segments", headers={"Authorization": "Bearer guessing-2"}).status_code == 429  # same prefix
    assert c.get("/v1/segments", headers={"Authorization": "Bearer other"}).status_code == 401  # another prefix
    assert c.get("/v1/segments", headers=A).status_code == 200  # a right key from that address still works
    assert c.get("/health", headers=A).status_code == 200
    assert c.get("/v1/segments").status_code == 401  # no key: a plain 401
    other = TestClient(c.app, client=("10.0.0.7", 40000))
    assert other.get("/v1/segments", headers=wrong).status_code == 401  # another address has its own count
    now[0] += 61
    assert c.get("/v1/segments", headers=wrong).status_code == 401  # the minute has passed
    text = c.get("/metrics", headers={"Authorization": "Bearer m-tok"}).text
    assert "hypic_auth_failures_total 8.0" in text  # every wrong key counted, refused ones too
