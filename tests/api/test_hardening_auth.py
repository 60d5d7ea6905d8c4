"""Failed-key limits never lock out a valid key (issue 38, item 2); /metrics closed with keys on."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.api.conftest import err

KEYS = {"key-alice-0123456789": "alice", "key-bob-0123456789": "bob"}
ALICE = {"Authorization": "Bearer key-alice-0123456789"}
BOB = {"X-API-Key": "key-bob-0123456789"}


def test_many_wrong_keys_from_one_address_lock_out_no_valid_key(make_client):
    c = make_client(api_keys=KEYS)  # defaults: 20 per prefix and address, 100 per address
    codes = [
        c.get("/v1/segments", headers={"Authorization": f"Bearer key-alice-guess{i}"}).status_code for i in range(25)
    ]
    assert codes[:20] == [401] * 20 and set(codes[20:]) == {429}  # the wrong attempts are still limited
    r = c.get("/v1/segments", headers={"Authorization": "Bearer key-alice-guess99"})
    assert r.status_code == 429 and err(r)["param"] == "authorization" and int(r.headers["retry-after"]) >= 1
    # from the very same address: the same tenant's valid key and another tenant's both authenticate
    assert c.get("/v1/segments", headers=ALICE).status_code == 200
    assert c.get("/v1/segments", headers=BOB).status_code == 200
    r = c.post("/v1/generate", json={"query": "hi", "max_tokens": 1}, headers=ALICE)
    assert r.status_code == 200, r.text
    assert c.get("/health", headers=BOB).json()["auth"] == "api_keys"


def test_the_address_wide_limit_refuses_wrong_keys_of_any_prefix_only(make_client):
    c = make_client(api_keys=KEYS, auth_failures_per_minute=0, auth_address_failures_per_minute=5)
    codes = [c.get("/v1/models", headers={"X-API-Key": f"{i:02d}-random-guess"}).status_code for i in range(7)]
    assert codes == [401] * 5 + [429] * 2  # each guess has its own prefix: the per-address count stops them
    assert c.get("/v1/models", headers=ALICE).status_code == 200
    other = TestClient(c.app, client=("10.0.0.9", 5000))
    assert other.get("/v1/models", headers={"X-API-Key": "zz-random-guess"}).status_code == 401


def test_wrong_metrics_tokens_are_limited_and_the_token_still_works(make_client):
    c = make_client(api_keys=KEYS, metrics_token="metrics-secret-token", auth_failures_per_minute=2)
    bad = {"Authorization": "Bearer metrics-guess"}
    assert [c.get("/metrics", headers=bad).status_code for _ in range(3)] == [401, 401, 429]
    r = c.get("/metrics", headers={"Authorization": "Bearer metrics-secret-token"})
    assert r.status_code == 200 and "hypic_auth_failures_total 3.0" in r.text


def test_metrics_closed_with_keys_on_and_no_token(make_client):
    c = make_client(api_keys=KEYS)
    local = TestClient(c.app, client=("127.0.0.1", 40001))
    for client, headers in ((c, {}), (local, {}), (local, ALICE)):
        r = client.get("/metrics", headers=headers)
        assert r.status_code == 401 and err(r)["type"] == "unauthorized"
    assert "hypic_" not in r.text
