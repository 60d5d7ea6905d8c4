"""Registry CRUD and queries, on SQLite and (when HYPIC_TEST_POSTGRES_URL is set) PostgreSQL."""

from __future__ import annotations

import threading

import pytest

from hypic_agent.errors import InvalidRequestError
from hypic_agent.segments.store.record import EntryRecord
from hypic_agent.segments.store.registry import Registry


def rec(key: str, tenant: str = "t1", **kw) -> EntryRecord:
    base = dict(
        key=key, tenant=tenant, kind="document", n_tokens=3, model_fingerprint="fp", created_at=100.0,
        last_used_at=100.0, nbytes=1024, tier="disk", location=f"{key[:2]}/{key}.safetensors", checksum="c" * 32,
        prefill_ms=12.5, token_ids=(1, 2, 2**31 - 1), token_digest="d" * 32, text="Document\nx\n\n", title="X",
        meta={"src": "wiki", "n": 1},
    )  # fmt: skip
    base.update(kw)
    return EntryRecord(**base)


@pytest.fixture
def registry(registry_url):
    reg = Registry(registry_url)
    yield reg
    reg.close()


def test_round_trip_and_update(registry):
    r = registry.upsert(rec("k1"))
    assert r.seq is not None
    got = registry.get("k1")
    assert got == r
    assert (
        got.token_ids == (1, 2, 2**31 - 1) and got.meta == {"src": "wiki", "n": 1} and got.text.startswith("Document")
    )
    assert registry.get("k1", tenant="t2") is None  # tenants never see each other's rows
    again = registry.upsert(rec("k1", nbytes=2048, state="writing"))
    assert again.seq == r.seq and registry.get("k1").nbytes == 2048 and registry.get("k1").state == "writing"
    assert registry.count() == 1


def test_delete_and_tenant_guard(registry):
    registry.upsert(rec("k1"))
    registry.upsert(rec("k2"))
    assert not registry.delete("k1", tenant="other")
    assert registry.delete("k1", tenant="t1") and registry.get("k1") is None
    assert registry.delete_many(["k2", "zz"]) == 1 and registry.count() == 0


def test_touch_pin_ttl_and_expiry(registry):
    registry.upsert(rec("k1"))
    registry.upsert(rec("k2", ttl_s=10.0))
    assert registry.get("k2").expires_at == 110.0
    registry.touch("k1", now=150.0)
    registry.touch_many({"k2": (200.0, 3)})
    assert registry.get("k1").hits == 1 and registry.get("k1").last_used_at == 150.0
    assert registry.get("k2").hits == 3 and registry.get("k2").expires_at == 210.0  # sliding TTL
    assert registry.expired(209.9) == [] and registry.expired(210.0) == ["k2"]
    r = registry.set_policy("k1", pinned=True, ttl_s=5.0)
    assert r.pinned and r.ttl_s == 5.0 and registry.expired(155.0) == ["k1"]
    r = registry.set_policy("k1", ttl_s=None)
    assert r.ttl_s is None and r.pinned and registry.expired(1e9) == ["k2"]
    assert registry.set_policy("missing", pinned=True) is None
    with pytest.raises(InvalidRequestError, match="ttl"):
        registry.set_policy("k1", ttl_s=0)


def test_set_location(registry):
    registry.upsert(rec("k1", state="writing", tier="cpu", location=None, checksum=None))
    assert registry.set_location("k1", tier="disk", location="k1/f", checksum="abc", state="ready", nbytes=9)
    r = registry.get("k1")
    assert (r.tier, r.location, r.checksum, r.state, r.nbytes) == ("disk", "k1/f", "abc", "ready", 9)
    assert registry.set_location("k1", tier="gpu") and registry.get("k1").location == "k1/f"
    assert not registry.set_location("missing", tier="gpu")


def test_list_paginates_per_tenant(registry):
    for i in range(7):
        registry.upsert(rec(f"a{i}", kind="memory" if i % 2 else "document"))
    registry.upsert(rec("b0", tenant="t2"))
    seen, cursor = [], None
    while True:
        page = registry.list_entries("t1", limit=3, cursor=cursor)
        assert len(page.items) <= 3 and all(r.token_ids is None and r.text is None for r in page.items)
        seen += [r.key for r in page.items]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == [f"a{i}" for i in reversed(range(7))]  # newest first, no repeats, no other tenant
    assert [r.key for r in registry.list_entries("t1", kind="memory").items] == ["a5", "a3", "a1"]
    assert registry.list_entries("t2").items[0].key == "b0" and registry.list_entries("nobody").items == []
    with pytest.raises(InvalidRequestError, match="cursor"):
        registry.list_entries("t1", cursor="abc")
    with pytest.raises(InvalidRequestError, match="limit"):
        registry.list_entries("t1", limit=0)


def test_records_for_recovery(registry):
    registry.upsert(rec("k1"))
    registry.upsert(rec("k2", state="writing"))
    rows = registry.records()
    assert [r.key for r in rows] == ["k1", "k2"] and rows[1].state == "writing" and rows[0].token_ids is None


def test_concurrent_upserts_of_one_key(registry):
    errors = []

    def work(i):
        try:
            for j in range(5):
                registry.upsert(rec("same", nbytes=i * 10 + j))
                registry.touch("same", now=float(j))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and registry.count() == 1


def test_survives_reopen(registry_url):
    Registry(registry_url).upsert(rec("k1"))
    reg = Registry(registry_url)
    assert reg.get("k1").tier == "disk"
    reg.close()
