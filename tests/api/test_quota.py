"""Per-tenant budgets (issue 22): pinned bytes hold to each tenant's quota; one tenant's uploads
never evict another tenant below its reserved share."""

from __future__ import annotations

from tests.api.conftest import PARIS, doc, err, state

KEYS = {"key-alice": "alice", "key-bob": "bob"}
A = {"Authorization": "Bearer key-alice"}
B = {"Authorization": "Bearer key-bob"}
DISK = 400_000  # a tiny-model entry of these documents is ~80 kB: each tenant's half holds two pinned
PINNED = {"pin": True}


def _doc(i: int) -> dict:
    return doc(f"{PARIS} This is note number {i} about it.")


def _put(c, headers, i, **cache):
    return c.put("/v1/segments", json={"segments": [{**_doc(i), "cache": cache}]}, headers=headers)


def test_pinned_bytes_hold_to_each_tenants_quota(make_client):
    c = make_client(api_keys=KEYS, cpu_budget_bytes=DISK, disk_budget_bytes=DISK)
    store = state(c).store
    ok = [_put(c, A, i, **PINNED) for i in range(2)]
    assert [r.status_code for r in ok] == [200, 200] and all(r.json()["data"][0]["pin"] for r in ok)
    r = _put(c, A, 2, **PINNED)
    assert r.status_code == 409
    e = err(r)
    assert e["type"] == "pin_quota_exceeded" and e["param"] == "cache.pin"
    assert "tenant 'alice'" in e["message"] and "quota of 0.2 MB" in e["message"] and "50% of the disk" in e["message"]
    third = [d for d in c.get("/v1/segments", headers=A).json()["data"] if not d["pin"]]
    assert len(third) == 1  # stored, but not pinned
    r = c.patch(f"/v1/segments/{third[0]['id']}", json={"cache": {"pin": True}}, headers=A)
    assert r.status_code == 409 and err(r)["type"] == "pin_quota_exceeded"

    # bob's quota is his own: alice's pins do not eat into it
    for i in range(10, 12):
        r = _put(c, B, i, **PINNED)
        assert r.status_code == 200 and r.json()["data"][0]["pin"], r.text
    assert _put(c, B, 12, **PINNED).status_code == 409
    pinned = {"alice": 0, "bob": 0}
    for e_ in store._index.values():
        if e_.pinned and e_.location:
            pinned[e_.tenant] += e_.file_bytes
    assert 0 < pinned["alice"] <= DISK // 2 and 0 < pinned["bob"] <= DISK // 2
    assert store.stats().tiers["disk"].bytes <= DISK and store.stats().tiers["cpu"].bytes <= DISK

    # unpinning one makes room for the next pin
    [first] = [d for d in c.get("/v1/segments", headers=A).json()["data"] if d["pin"]][:1]
    assert c.patch(f"/v1/segments/{first['id']}", json={"cache": {"pin": False}}, headers=A).status_code == 200
    r = c.patch(f"/v1/segments/{third[0]['id']}", json={"cache": {"pin": True}}, headers=A)
    assert r.status_code == 200 and r.json()["pin"] is True


def test_entry_larger_than_the_quota_is_413(make_client):
    c = make_client(api_keys=KEYS, disk_budget_bytes=DISK, tenant_shares={"alice": 0.1})
    r = _put(c, A, 0, **PINNED)
    assert r.status_code == 413 and err(r)["type"] == "pin_quota_exceeded"
    assert "may pin at most 0.04 MB" in err(r)["message"]
    assert _put(c, B, 0, **PINNED).status_code == 200  # bob keeps the default half


def test_one_tenant_does_not_evict_another_below_its_share(make_client):
    c = make_client(api_keys=KEYS, cpu_budget_bytes=DISK, disk_budget_bytes=DISK)
    [bob] = _put(c, B, 100).json()["data"]  # unpinned, well within bob's half
    for i in range(8):  # alice uploads far more than the tiers hold, unpinned
        assert _put(c, A, i).status_code == 200
    got = c.get(f"/v1/segments/{bob['id']}", headers=B).json()
    assert got["tier"] in ("cpu", "disk") and got["bytes"] > 0
    alice = c.get("/v1/segments?limit=100", headers=A).json()["data"]
    assert sum(d["tier"] == "none" for d in alice) >= 4  # alice turned over her own entries instead
    r = c.post("/v1/generate", json={"segments": [{"id": bob["id"]}], "query": "q", "max_tokens": 1}, headers=B)
    assert r.json()["usage"]["segments"][0]["hit"] is True
