"""Tenants' shares of the tier budgets: pin quota per tenant, eviction reserve across tenants."""

from __future__ import annotations

import os

import pytest

from hypic_agent.config import Settings
from hypic_agent.segments.store.quota import EntryTooLargeError, PinQuotaError, TenantShares

from .helpers import FakeClock, entry_bytes, key, make_store, meta, payload

E = entry_bytes()  # 260 payload bytes per entry
TWO = TenantShares(0.5, {}, ("t1", "t2"))


def _pinned(s, tenant: str) -> int:
    """Bytes on disk of ``tenant``'s pinned entries: its listed rows' files."""
    rows = s.list_entries(tenant, limit=1000).items
    return sum(os.path.getsize(s.disk.path(r.location)) for r in rows if r.pinned and r.location)


def test_shares_from_settings():
    assert TenantShares.from_settings(Settings()).share("default") == 1.0  # no keys: one tenant, whole tiers
    sh = TenantShares.from_settings(Settings(api_keys={"k1": "a", "k2": "b", "k3": "c", "k4": "c"}))
    assert sh.share("a") == pytest.approx(1 / 3) and sh.tenants == ("a", "b", "c")
    assert sh.quota("a", 900) == 300 and sh.reserve("b", 900) == 300
    over = TenantShares.from_settings(Settings(api_keys={"k1": "a", "k2": "b"}, tenant_share=0.8))
    assert over.quota("a", 1000) == 800 and over.reserve("a", 1000) == 500  # 0.8 / 1.6: reserves fit the tier
    custom = TenantShares.from_settings(Settings(api_keys={"k1": "a", "k2": "b"}, tenant_shares={"a": 0.75}))
    assert (custom.quota("a", 100), custom.quota("b", 100), custom.reserve("b", 100)) == (75, 50, 40)


def test_pinned_bytes_stay_within_each_tenants_quota(tmp_path):
    clock = FakeClock()
    s = make_store(tmp_path, clock=clock, cpu_budget_bytes=8 * E, disk_budget_bytes=8 * (E + 600), shares=TWO)
    quota = s.shares.quota("t1", s.disk.budget)
    for i in range(8):  # t1 asks to pin eight entries: only as many as its half of the disk are pinned
        clock.now += 1
        s.put(key(i, tenant="t1"), payload(i), meta(i, tenant="t1", pinned=True))
        assert _pinned(s, "t1") <= quota
    pinned = [i for i in range(8) if s.info(key(i, tenant="t1")).pinned]
    assert 2 <= len(pinned) < 8 and pinned == list(range(len(pinned)))
    extra = key(len(pinned), tenant="t1")
    with pytest.raises(PinQuotaError, match=f"quota of {quota} bytes"):
        s.set_policy(extra, "t1", pinned=True)
    assert not s.info(extra).pinned

    for i in range(20, 28):  # t2 still has its own half to pin
        clock.now += 1
        s.put(key(i, tenant="t2"), payload(i), meta(i, tenant="t2", pinned=True))
    assert sum(s.info(key(i, tenant="t2")).pinned for i in range(20, 28)) == len(pinned)
    assert _pinned(s, "t1") + _pinned(s, "t2") <= s.disk.budget and s.disk.used <= s.disk.budget

    s.set_policy(key(0, tenant="t1"), "t1", pinned=False)  # unpinning makes room again
    assert s.set_policy(extra, "t1", pinned=True).pinned


def test_a_used_up_quota_is_refused_up_front(tmp_path):
    s = make_store(tmp_path, disk_budget_bytes=1 << 20, shares=TWO)
    s.put(key(0), payload(0), meta(0, pinned=True))
    s.disk.budget = 2 * s._index[key(0)].file_bytes  # its one pinned file fills t1's half
    with pytest.raises(PinQuotaError, match="its whole quota"):
        s.check_pin_room("t1")
    s.check_pin_room("t2")


def test_entry_over_the_whole_quota_is_413(tmp_path):
    s = make_store(tmp_path, disk_budget_bytes=4 * E, shares=TenantShares(0.5, {"t1": 0.1}, ("t1", "t2")))
    s.put(key(0), payload(0), meta(0))
    with pytest.raises(EntryTooLargeError, match="may pin at most 104 bytes"):
        s.set_policy(key(0), "t1", pinned=True)


def test_pinned_entry_over_its_memory_quota_is_held_on_disk(tmp_path):
    s = make_store(tmp_path, cpu_budget_bytes=3 * E, disk_budget_bytes=1 << 20, shares=TWO)
    s.put(key(0), payload(0), meta(0, pinned=True))
    s.put(key(1), payload(1), meta(1, pinned=True))  # a second one would be 2E > 1.5E of the CPU tier
    assert [s.info(key(i)).tier for i in (0, 1)] == ["cpu", "disk"] and s.info(key(1)).pinned
    assert s.get(key(1))[1] == "disk" and s.info(key(1)).tier == "disk"  # served, still not in memory


@pytest.mark.parametrize("shares", [TWO, None])
def test_one_tenant_never_evicts_another_below_its_reserve(tmp_path, shares):
    clock = FakeClock()
    s = make_store(tmp_path, clock=clock, cpu_budget_bytes=4 * E, disk_budget_bytes=4 * (E + 600), shares=shares)
    for i in (0, 1):  # t2: two cheap entries, half of every tier (its reserve)
        s.put(key(i, tenant="t2"), payload(i), meta(i, tenant="t2", prefill_ms=0.001))
    for i in range(10, 30):  # t1: a stream of costly uploads, far more than the tiers hold
        clock.now += 1
        s.put(key(i, tenant="t1"), payload(i), meta(i, tenant="t1", prefill_ms=1000.0))
        assert s.cpu.used <= s.cpu.budget and s.disk.used <= s.disk.budget
    t2_tiers = [s.info(key(i, tenant="t2")).tier for i in (0, 1)]
    if shares is None:  # no shares: cheap entries go first, whoever they belong to
        assert t2_tiers == ["none", "none"]
    else:
        assert t2_tiers == ["cpu", "cpu"] and all(s.get(key(i, tenant="t2")) for i in (0, 1))
        assert sum(e.tenant == "t1" for e in s._index.values() if e.mem_tier) == 2  # t1 turns over its half
