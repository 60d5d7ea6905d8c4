"""The registry tells the truth: after any mix of operations every row's tier, file and pin match
the store's live state, every file has its row and checksum, and buffered hits reach the row."""

from __future__ import annotations

import torch

from hypic_agent.segments.store.quota import TenantShares

from .helpers import FakeClock, entry_bytes, key, make_store, meta, payload

E = entry_bytes()


def _check(s) -> None:
    s.flush()
    rows = {r.key: r for r in s.registry.records()}
    assert rows.keys() == s._index.keys()
    files = {p.relative_to(s.disk.root).as_posix() for p in s.disk.root.rglob("*.safetensors")}
    for k, e in s._index.items():
        r = rows[k]
        assert (r.tier, r.location, r.checksum, r.pinned, r.hits) == (e.tier, e.location, e.checksum, e.pinned, e.hits)
        assert (e.mem_tier is not None) == (k in s.gpu or k in s.cpu)
        if r.location:
            assert r.location in files and r.checksum
    assert files == {r.location for r in rows.values() if r.location}


def test_registry_tier_column_stays_true_under_churn(tmp_path):
    clock = FakeClock()
    s = make_store(
        tmp_path,
        clock=clock,
        gpu_device="cpu",
        gpu_budget_bytes=2 * E,
        cpu_budget_bytes=3 * E,
        disk_budget_bytes=6 * (E + 600),
        shares=TenantShares(0.5, {}, ("t1", "t2")),
    )
    g = torch.Generator().manual_seed(1)
    for step in range(200):
        clock.now += 1
        op, i = (int(x) for x in torch.randint(0, 12, (2,), generator=g))
        tenant = "t1" if i % 2 else "t2"
        k = key(i, tenant=tenant)
        if op < 5:
            if s.get(k) is None:
                s.put(k, payload(i), meta(i, tenant=tenant, prefill_ms=float(i), pinned=op == 0))
        elif op < 7 and k in s._index:
            try:
                s.set_policy(k, tenant, pinned=op == 5)
            except Exception as exc:  # over the pin quota: refused, nothing changed
                assert "quota" in str(exc)
        elif op == 7:
            s.delete(k)
        elif op == 8 and k in s._index and s._index[k].location:
            path = s.disk.path(s._index[k].location)
            path.write_bytes(path.read_bytes()[:-7])  # truncated: dropped to tier none on the next read
            if s._index[k].mem_tier is None:
                assert s.get(k) is None
        _check(s)
        for tier in (s.gpu, s.cpu):
            assert tier.used <= tier.budget, (step, tier.name)
        assert s.disk.used <= s.disk.budget, step
    assert s.stats().evicted > 0 and any(e.tier == "none" for e in s._index.values())
