"""Tiered entry store: tiers, budgets, eviction order, pin/TTL, integrity, restart, crash recovery."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from hypic_agent.segments.store.disk_tier import DiskTier
from hypic_agent.segments.store.eviction import EvictionPolicy
from hypic_agent.segments.store.registry import Registry

from .helpers import FakeClock, entry_bytes, key, make_store, meta, payload, same

E = entry_bytes()  # 260 bytes per entry


def test_round_trip_across_tiers(tmp_path):
    # a "gpu" pool on the CPU device exercises the three-tier logic on any machine
    clock = FakeClock()
    s = make_store(tmp_path, clock=clock, gpu_device="cpu", gpu_budget_bytes=2 * E, cpu_budget_bytes=2 * E)
    for i in range(5):
        clock.now += 1
        assert s.put(key(i), payload(i), meta(i)) == "gpu"
    st = s.stats()
    assert (st.tiers["gpu"].entries, st.tiers["cpu"].entries, st.tiers["disk"].entries) == (2, 2, 5)
    assert st.tiers["gpu"].evictions == 3 and st.tiers["cpu"].evictions == 1
    where = {s.registry.get(key(i)).tier for i in range(5)}
    assert where == {"gpu", "cpu", "disk"}
    for i in range(5):  # every entry comes back intact from wherever it lives, then sits in the GPU pool
        before = s.registry.get(key(i)).tier
        clock.now += 1
        tensors, tier = s.get(key(i))
        assert tier == before and same(tensors, payload(i))
        assert s.registry.get(key(i)).tier == "gpu"
    assert s.stats().hits == 5


def test_a_reread_counts_no_hit_or_miss(tmp_path):
    """``get(count=False)`` (a request re-reading an entry its admission already counted) serves the
    payload from memory or disk alike but leaves hits, last-used time and the store's counts as they are."""
    clock = FakeClock()
    s = make_store(tmp_path, clock=clock, gpu_device="cpu", gpu_budget_bytes=E, cpu_budget_bytes=0)
    for i in range(2):
        clock.now += 1
        s.put(key(i), payload(i), meta(i))
    clock.now += 1
    assert s.get(key(1)) is not None  # the counted use: one hit
    s.flush()
    rec = s.registry.get(key(1))
    assert rec.hits == 1 and s.stats().hits == 1
    clock.now += 1
    for i, where in ((1, "gpu"), (0, "disk")):  # key(0) left the one-entry pool: read from disk
        tensors, tier = s.get(key(i), count=False)
        assert tier == where and same(tensors, payload(i))
    assert s.get("absent", count=False) is None
    s.flush()
    assert s.registry.get(key(1)).hits == 1 and s.registry.get(key(1)).last_used_at == rec.last_used_at
    assert s.registry.get(key(0)).hits == 0
    assert (s.stats().hits, s.stats().misses) == (1, 0)


def test_budgets_respected_under_churn(tmp_path):
    clock = FakeClock()
    s = make_store(
        tmp_path, clock=clock, gpu_device="cpu", gpu_budget_bytes=3 * E, cpu_budget_bytes=4 * E, disk_budget_bytes=6000
    )
    g = torch.Generator().manual_seed(0)
    for step in range(60):
        clock.now += 1
        i = int(torch.randint(0, 15, (1,), generator=g))
        if s.get(key(i)) is None:
            s.put(key(i), payload(i), meta(i, prefill_ms=float(i)))
        st = s.stats()
        for name in ("gpu", "cpu", "disk"):
            assert st.tiers[name].bytes <= st.tiers[name].budget, (step, name, st)
    files = [p for p in (tmp_path / "store").rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) == s.stats().tiers["disk"].bytes
    rows = s.registry.records()
    assert len(files) == s.stats().tiers["disk"].entries == len([r for r in rows if r.location])
    assert len(rows) == s.stats().entries == len({key(i) for i in range(15)} & {r.key for r in rows})
    evicted = [r for r in rows if r.tier == "none"]  # left every tier: the rows stay, without payload
    assert evicted and all(r.location is None and r.nbytes == E for r in evicted)


def test_eviction_order_is_cost_aware(tmp_path):
    clock = FakeClock()
    s = make_store(tmp_path, clock=clock, cpu_budget_bytes=3 * E)
    s.put(key(0), payload(0), meta(0, prefill_ms=100.0))  # expensive to recompute
    s.put(key(1), payload(1), meta(1, prefill_ms=1.0))  # cheap
    s.put(key(2), payload(2), meta(2, prefill_ms=5.0))
    for _ in range(3):
        s.get(key(2))  # cheap-ish but popular: 5 x 4 > 1 x 1
    clock.now += 1
    s.put(key(3), payload(3), meta(3, prefill_ms=50.0))
    assert s.registry.get(key(1)).tier == "disk"  # the cheap, unused one left memory first
    assert {s.registry.get(key(i)).tier for i in (0, 2, 3)} == {"cpu"}
    clock.now += 1
    s.put(key(4), payload(4), meta(4, prefill_ms=50.0))
    assert s.registry.get(key(2)).tier == "disk"  # score 5*4=20 < 50 < 100


def test_policy_scores():
    from dataclasses import dataclass

    @dataclass
    class C:
        key: str
        nbytes: int
        prefill_ms: float
        hits: int
        last_used_at: float

    pol = EvictionPolicy(half_life_s=10.0)
    cands = [
        C("big", 1000, 10.0, 0, 100.0),  # 0.01 per byte
        C("small", 100, 10.0, 0, 100.0),  # 0.1
        C("stale", 100, 10.0, 3, 80.0),  # 40 * 0.25 / 100 = 0.1, older -> first among equals
        C("hot", 100, 10.0, 9, 100.0),  # 1.0
    ]
    assert [c.key for c in pol.order(cands, now=100.0)] == ["big", "stale", "small", "hot"]
    assert [c.key for c in pol.victims(cands, need_bytes=1050, now=100.0)] == ["big", "stale"]


def test_pinned_entries_are_never_evicted(tmp_path):
    clock = FakeClock()
    s = make_store(tmp_path, clock=clock, cpu_budget_bytes=2 * E, disk_budget_bytes=2 * (E + 600))
    s.put(key(0), payload(0), meta(0, prefill_ms=0.0, pinned=True))
    for i in range(1, 8):
        clock.now += 100
        s.put(key(i), payload(i), meta(i, prefill_ms=1000.0))
    rec = s.registry.get(key(0))
    assert rec.pinned and rec.tier == "cpu" and rec.location is not None
    assert same(s.get(key(0))[0], payload(0))
    assert s.stats().evicted > 0  # others did leave the store
    s.set_policy(key(0), pinned=False)
    for i in range(8, 12):
        clock.now += 100
        s.put(key(i), payload(i), meta(i, prefill_ms=1000.0))
    assert s.get(key(0)) is None and s.registry.get(key(0)).tier == "none"  # evicted once unpinned, row kept


def test_ttl_expiry_is_sliding(tmp_path):
    clock = FakeClock()
    s = make_store(tmp_path, clock=clock)
    s.put(key(0), payload(0), meta(0, ttl_s=10.0))
    s.put(key(1), payload(1), meta(1, ttl_s=10.0, pinned=True))  # pinning does not outlive a TTL
    s.put(key(2), payload(2), meta(2))
    clock.now += 8
    assert s.get(key(0)) is not None  # refreshes key 0 only
    clock.now += 8
    assert s.expire() == 1 and s.registry.get(key(1)) is None
    assert s.get(key(0)) is not None
    clock.now += 11
    assert s.get(key(0)) is None and s.stats().expired == 2
    assert s.get(key(2)) is not None and s.registry.count() == 1
    assert not any(p.name.startswith(key(0)) for p in (tmp_path / "store").rglob("*"))


def test_default_ttl_and_policy_changes(tmp_path):
    clock = FakeClock()
    s = make_store(tmp_path, clock=clock, default_ttl_s=5.0)
    s.put(key(0), payload(0), meta(0))
    assert s.registry.get(key(0)).ttl_s == 5.0
    s.set_policy(key(0), ttl_s=None)
    clock.now += 100
    assert s.get(key(0)) is not None
    assert s.set_policy(key(0), tenant="other", pinned=True) is None


def _evict_from_memory(s, k):
    s.cpu.pop(k)
    s._index[k].mem_tier = None


def test_corrupt_file_is_detected_and_never_served(tmp_path):
    s = make_store(tmp_path)
    s.put(key(0), payload(0), meta(0))
    _evict_from_memory(s, key(0))
    path = s.disk.path(s.registry.get(key(0)).location)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # flip bits inside the tensor bytes
    path.write_bytes(bytes(data))
    assert s.get(key(0)) is None
    assert s.stats().corrupt == 1 and not path.exists()
    rec = s.registry.get(key(0))  # the row stays: tokens and text to rebuild it from
    assert (rec.tier, rec.location, rec.checksum, rec.token_ids, rec.text) == ("none", None, None, (0, 1), "doc 0")
    assert s.get(key(0)) is None  # no payload until the caller recomputes and puts it again
    assert s.put(key(0), payload(0), meta(0)) == "cpu" and same(s.get(key(0))[0], payload(0))
    assert s.registry.get(key(0)).hits == 1 and s.registry.get(key(0)).created_at == rec.created_at


def test_truncated_and_missing_files(tmp_path):
    s = make_store(tmp_path)
    for i in range(2):
        s.put(key(i), payload(i), meta(i))
        _evict_from_memory(s, key(i))
    p0 = s.disk.path(s.registry.get(key(0)).location)
    p0.write_bytes(p0.read_bytes()[:40])
    s.disk.path(s.registry.get(key(1)).location).unlink()
    assert s.get(key(0)) is None and s.get(key(1)) is None
    assert s.stats().corrupt == 2 and {r.tier for r in s.registry.records()} == {"none"} and s.registry.count() == 2


def test_foreign_fingerprint_is_not_served(tmp_path):
    s = make_store(tmp_path)
    s.put(key(0), payload(0), meta(0))
    assert s.get(key(0), model_fingerprint="another-model") is None  # deleted, not served
    assert s.stats().rejected == 1 and s.registry.get(key(0)) is None
    s.put(key(1), payload(1), meta(1))
    assert s.get(key(1), token_digest="0" * 32) is None and s.registry.get(key(1)) is None
    s.put(key(2), payload(2), meta(2))
    assert s.get(key(2), tenant="t2") is None and s.registry.get(key(2)) is not None  # not theirs, kept


def test_foreign_file_swapped_in_is_not_served(tmp_path):
    s = make_store(tmp_path)
    s.put(key(0), payload(0), meta(0))
    _evict_from_memory(s, key(0))
    rec = s.registry.get(key(0))
    # a well-formed file with a valid checksum, but written for another model
    other = DiskTier(tmp_path / "elsewhere", 1 << 20).write(
        key(0), payload(0), {"key": key(0), "model_fingerprint": "x"}
    )
    os.replace(tmp_path / "elsewhere" / other.location, s.disk.path(rec.location))
    s.registry.set_location(key(0), tier="disk", checksum=other.checksum)
    s._index[key(0)].checksum = other.checksum
    assert s.get(key(0)) is None and s.stats().corrupt == 1


def test_restart_sees_disk_entries(tmp_path):
    clock = FakeClock()
    s = make_store(tmp_path, clock=clock)
    for i in range(3):
        s.put(key(i), payload(i), meta(i, pinned=(i == 1)))
    s.register(key(9), meta(9))  # definition only (e.g. too short to cache)
    s.get(key(0))
    s.close()
    s2 = make_store(tmp_path, clock=clock)
    assert s2.stats().entries == 4 and s2.stats().tiers["cpu"].entries == 0
    for i in range(3):
        tensors, tier = s2.get(key(i))
        assert tier == "disk" and same(tensors, payload(i))
    rec = s2.info(key(0))
    assert rec.hits == 2 and rec.token_ids == (0, 1) and rec.text == "doc 0" and s2.info(key(1)).pinned
    assert s2.get(key(9)) is None and s2.info(key(9)).tier == "none"
    assert [r.key for r in s2.list_entries("t1").items] == [key(9), key(2), key(1), key(0)]


def test_crash_mid_write_is_never_visible(tmp_path):
    """A real crash: a child process dies between writing the temp file and renaming it."""
    code = textwrap.dedent(
        f"""
        import os, sys
        sys.path.insert(0, {os.getcwd()!r})
        from tests.segments.helpers import make_store, key, payload, meta
        from pathlib import Path
        s = make_store(Path({str(tmp_path)!r}))
        s.put(key(0), payload(0), meta(0))
        os.replace = lambda *a: os._exit(3)
        s.put(key(1), payload(1), meta(1))
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    reg = Registry(f"sqlite:///{tmp_path / 'registry.sqlite3'}")
    assert reg.get(key(1)).state == "writing"
    assert any(p.name.endswith(".tmp") for p in (tmp_path / "store").rglob("*"))
    s = make_store(tmp_path, registry=reg)
    rec = s.registry.get(key(1))  # never published: no payload, but the row stays to rebuild it from
    assert (rec.tier, rec.state, rec.location, rec.token_ids) == ("none", "ready", None, (1, 2))
    assert s.get(key(1)) is None
    assert same(s.get(key(0))[0], payload(0))
    assert not any(p.name.endswith(".tmp") for p in (tmp_path / "store").rglob("*"))


def test_recovery_drops_orphans_keeps_memory_only_rows(tmp_path):
    s = make_store(tmp_path, disk_budget_bytes=0)  # memory only: no payload survives a restart
    s.put(key(0), payload(0), meta(0))
    assert s.registry.get(key(0)).tier == "cpu"
    s.close()
    s = make_store(tmp_path)
    rec = s.registry.get(key(0))
    assert (rec.tier, rec.location, rec.text) == ("none", None, "doc 0") and s.get(key(0)) is None
    orphan = DiskTier(tmp_path / "store", 1 << 20).write(key(5), payload(5), {"key": key(5)})
    s.put(key(1), payload(1), meta(1))
    s.close()
    s = make_store(tmp_path)
    assert not s.disk.path(orphan.location).exists() and s.get(key(1)) is not None


def test_replace_and_delete(tmp_path):
    s = make_store(tmp_path)
    s.put(key(0), payload(0), meta(0))
    old = s.registry.get(key(0)).location
    s.put(key(0), payload(7), meta(0))
    assert same(s.get(key(0))[0], payload(7)) and not s.disk.path(old).exists()
    assert len(list((tmp_path / "store").rglob("*.safetensors"))) == 1
    assert not s.delete(key(0), tenant="t2") and s.delete(key(0))
    assert s.get(key(0)) is None and s.registry.count() == 0 and not list((tmp_path / "store").rglob("*.safetensors"))


def test_too_big_for_every_tier(tmp_path):
    s = make_store(tmp_path, cpu_budget_bytes=100, disk_budget_bytes=100)
    assert s.put(key(0), payload(0), meta(0)) is None and s.registry.count() == 0
    s2 = make_store(tmp_path / "b", cpu_budget_bytes=100, disk_budget_bytes=1 << 20)
    assert s2.put(key(0), payload(0), meta(0)) == "disk" and s2.get(key(0))[1] == "disk"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_real_gpu_and_pinned_tiers(tmp_path):
    s = make_store(tmp_path, gpu_device="auto", gpu_budget_bytes=E, cpu_budget_bytes=4 * E)
    s.put(key(0), payload(0), meta(0))
    tensors, tier = s.get(key(0))
    assert tier == "gpu" and tensors["layer0.S"].is_cuda
    s.put(key(1), payload(1), meta(1))  # pushes key 0 down into pinned host memory
    held = s.cpu.get(key(0))
    assert held is not None and held["layer0.S"].is_pinned()
    tensors, tier = s.get(key(0))
    assert tier == "cpu" and tensors["layer0.S"].is_cuda and same(tensors, payload(0))


def test_store_over_any_registry(registry_url, tmp_path):
    """The store end to end on each registry backend (PostgreSQL when configured)."""
    clock = FakeClock()
    s = make_store(tmp_path, clock=clock, registry=Registry(registry_url), cpu_budget_bytes=2 * E)
    for i in range(3):
        clock.now += 1
        s.put(key(i), payload(i), meta(i))
    assert s.registry.get(key(0)).tier == "disk" and s.get(key(0))[1] == "disk"
    s.close()
    s2 = make_store(tmp_path, clock=clock, registry=Registry(registry_url))
    assert all(same(s2.get(key(i))[0], payload(i)) for i in range(3))
    assert s2.info(key(0)).hits == 2 and len(s2.list_entries("t1").items) == 3
