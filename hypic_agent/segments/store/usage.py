"""Hit / miss counting, buffered last-used times and hit counts, and ``stats()`` (``SegmentStore.usage``).

A hit updates the live ``IndexEntry`` at once and buffers the registry write (``pending``); a
re-read (``get(count=False)``) counts nothing;
buffered writes go out when ``flush_interval_s`` has passed since the last flush, whenever a
row is read or changed through the store, and on ``flush()`` / ``close()``. The caller holds the
store lock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from hypic_agent.segments.store.entries import IndexEntry, StoreStats, TierStats
from hypic_agent.segments.store.registry import Registry
from hypic_agent.segments.store.tiers import Tiers


class UsageLog:
    def __init__(self, registry: Registry, clock: Callable[[], float], flush_interval_s: float) -> None:
        self.registry = registry
        self.clock = clock
        self.flush_interval_s = flush_interval_s
        self.counts = dict.fromkeys(("hits", "misses", "evicted", "expired", "corrupt", "rejected"), 0)
        self.tier_evictions = {"gpu": 0, "cpu": 0, "disk": 0}
        self.pending: dict[str, tuple[float, int]] = {}
        self.last_flush = 0.0

    def count(self, name: str, n: int = 1) -> None:
        """Add ``n`` to one of ``StoreStats``' counters (``evicted``, ``expired``, ``corrupt``, ...)."""
        self.counts[name] += n

    def evicted_from(self, tier: str) -> None:
        self.tier_evictions[tier] += 1

    def miss(self, count: bool = True) -> None:
        if count:
            self.counts["misses"] += 1

    def hit(self, e: IndexEntry, now: float, count: bool = True) -> None:
        if not count:  # a re-read of a use already counted
            return
        self.counts["hits"] += 1
        e.hits += 1
        e.last_used_at = now
        _, n = self.pending.get(e.key, (now, 0))
        self.pending[e.key] = (now, n + 1)
        if now - self.last_flush >= self.flush_interval_s:
            self.flush()

    def forget(self, key: str) -> None:
        """Drop the buffered touches of a removed entry."""
        self.pending.pop(key, None)

    def flush(self) -> None:
        """Write buffered hit counts / last-used times to the registry."""
        if self.pending:
            self.registry.touch_many(self.pending)
            self.pending = {}
        self.last_flush = self.clock()

    def stats(self, tiers: Tiers, index: Mapping[str, IndexEntry], in_flight: int) -> StoreStats:
        out = {
            t.name: TierStats(t.used, t.budget, len(t), self.tier_evictions[t.name], t.enabled)
            for t in (tiers.gpu, tiers.cpu)
        }
        disk = tiers.disk
        on_disk = sum(1 for e in index.values() if e.location)
        out["disk"] = TierStats(disk.used, disk.budget, on_disk, self.tier_evictions["disk"], disk.enabled)
        return StoreStats(tiers=out, entries=len(index), in_flight=in_flight, **self.counts)
