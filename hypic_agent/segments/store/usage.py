"""Hit / miss counting, buffered last-used times and hit counts, and ``stats()`` (a mixin of
``SegmentStore``).

A hit updates the live ``IndexEntry`` at once and buffers the registry write (``_pending``); a
re-read (``get(count=False)``) counts nothing;
buffered writes go out when ``flush_interval_s`` has passed since the last flush, whenever a
row is read or changed through the store, and on ``flush()`` / ``close()``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypic_agent.segments.store.disk_tier import DiskTier
from hypic_agent.segments.store.entries import IndexEntry, StoreStats, Tensors, TierStats
from hypic_agent.segments.store.memory_tier import MemoryTier
from hypic_agent.segments.store.registry import Registry


class UsageLog:
    gpu: MemoryTier
    cpu: MemoryTier
    disk: DiskTier
    registry: Registry
    flush_interval_s: float
    clock: Callable[[], float]
    _lock: Any
    _flight: Any
    _index: dict[str, IndexEntry]
    _pending: dict[str, tuple[float, int]]
    _last_flush: float
    _counts: dict[str, int]
    _tier_evictions: dict[str, int]

    def flush(self) -> None:
        """Write buffered hit counts / last-used times to the registry."""
        with self._lock:
            self._flush_locked()

    def stats(self) -> StoreStats:
        with self._lock:
            tiers = {
                t.name: TierStats(t.used, t.budget, len(t), self._tier_evictions[t.name], t.enabled)
                for t in (self.gpu, self.cpu)
            }
            on_disk = sum(1 for e in self._index.values() if e.location)
            tiers["disk"] = TierStats(
                self.disk.used, self.disk.budget, on_disk, self._tier_evictions["disk"], self.disk.enabled
            )
            return StoreStats(tiers=tiers, entries=len(self._index), in_flight=self._flight.in_flight(), **self._counts)

    def _miss(self, count: bool = True) -> tuple[Tensors, str] | None:
        if count:
            self._counts["misses"] += 1
        return None

    def _hit_locked(
        self, e: IndexEntry, now: float, tensors: Tensors, found: str, count: bool = True
    ) -> tuple[Tensors, str]:
        if not count:  # a re-read of a use already counted
            return tensors, found
        self._counts["hits"] += 1
        e.hits += 1
        e.last_used_at = now
        _, n = self._pending.get(e.key, (now, 0))
        self._pending[e.key] = (now, n + 1)
        if now - self._last_flush >= self.flush_interval_s:
            self._flush_locked()
        return tensors, found

    def _flush_locked(self) -> None:
        if self._pending:
            self.registry.touch_many(self._pending)
            self._pending = {}
        self._last_flush = self.clock()
