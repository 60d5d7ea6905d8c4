"""Placement, promotion and budget enforcement across tiers (a mixin of ``SegmentStore``).

Every method here runs under the store lock (``*_locked``) and keeps three things in step:
the tiers' contents, the live ``IndexEntry`` records and the registry rows. Tenants' pin quotas
and eviction reserves come from ``quota.TenantQuota``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from hypic_agent.segments.store.disk_tier import DiskTier
from hypic_agent.segments.store.entries import EntryMeta, IndexEntry, Tensors
from hypic_agent.segments.store.eviction import EvictionPolicy
from hypic_agent.segments.store.headers import row_header
from hypic_agent.segments.store.memory_tier import MemoryTier
from hypic_agent.segments.store.quota import TenantQuota, fair_victims
from hypic_agent.segments.store.registry import Registry

log = logging.getLogger("hypic_agent.segments.store.segment_store")


class TierPolicy(TenantQuota):
    gpu: MemoryTier
    cpu: MemoryTier
    disk: DiskTier
    registry: Registry
    policy: EvictionPolicy
    flush_interval_s: float
    _index: dict[str, IndexEntry]
    _pending: dict[str, tuple[float, int]]
    _counts: dict[str, int]
    _tier_evictions: dict[str, int]
    _last_expire: float = 0.0
    clock: Callable[[], float]

    def _tier(self, name: str) -> MemoryTier:
        return self.gpu if name == "gpu" else self.cpu

    def _room(self, tier: MemoryTier, e: IndexEntry) -> bool:
        """Whether ``e`` can live in ``tier`` at all: pinned entries there cannot make way, and a
        pinned ``e`` must fit its tenant's quota of the tier."""
        if not tier.fits(e.nbytes) or (e.pinned and not self._pin_fits(tier, e)):
            return False
        pinned = sum(
            self._index[k].nbytes for k in tier.held_keys() if k != e.key and k in self._index and self._index[k].pinned
        )
        return e.nbytes <= tier.budget - pinned

    # ------------------------------------------------------------------ placement
    def _place_locked(self, e: IndexEntry, tensors: Tensors) -> Tensors | None:
        """Put the payload in the fastest memory tier with room; ``None`` if none has."""
        for tier in (self.gpu, self.cpu):
            if self._room(tier, e):
                held = tier.put(e.key, tensors)
                e.mem_tier = tier.name
                return held
        e.mem_tier = None
        return None

    def _promote_locked(self, e: IndexEntry, now: float) -> Tensors:
        """Move a CPU-resident payload up to the GPU pool (if it has room); return the held tensors."""
        assert e.mem_tier is not None
        if e.mem_tier == "cpu" and self._room(self.gpu, e):
            tensors = self.cpu.pop(e.key)
            assert tensors is not None
            held = self.gpu.put(e.key, tensors)
            e.mem_tier = "gpu"
            self._settle_locked(e)
            self._enforce_locked({e.key}, now)
            return held
        held_now = self._tier(e.mem_tier).get(e.key)
        assert held_now is not None
        return held_now

    def _settle_locked(self, e: IndexEntry) -> None:
        """Record where ``e`` now lives; an entry left in no tier keeps its row (``tier = none``)."""
        if e.has_payload and e.mem_tier is None and e.location is None and e.state != "writing":
            self._counts["evicted"] += 1
            self._drop_payload_locked(e)
        else:
            self.registry.set_location(e.key, tier=e.tier, location=e.location, checksum=e.checksum)

    # ------------------------------------------------------------------ disk copy
    def _write_through(self, entry: IndexEntry, tensors: Tensors, meta: EntryMeta) -> str | None:
        """Write the disk copy outside the lock, then publish it if the entry is still current."""
        md = row_header(entry, meta)  # the file describes its row: a lost registry is rebuilt from it
        try:
            written = self.disk.write(entry.key, tensors, md)
        except OSError as exc:
            log.warning("disk write of entry %s failed: %s", entry.key, exc)
            with self._lock:
                if self._index.get(entry.key) is entry:
                    entry.state = "ready"
                    self._settle_locked(entry)
            return None
        with self._lock:
            if self._index.get(entry.key) is not entry:  # deleted or replaced meanwhile
                self.disk.remove(written.location)
                return None
            entry.location, entry.checksum, entry.file_bytes = written.location, written.checksum, written.file_bytes
            entry.state = "ready"
            self.disk.used += written.file_bytes
            if entry.pinned and (refused := self._pin_error(entry, entry.nbytes)) is not None:
                log.warning("entry %s unpinned: its file came out larger than estimated: %s", entry.key, refused)
                entry.pinned = False
                self.registry.set_policy(entry.key, pinned=False)
            self.registry.set_location(
                entry.key, tier=entry.tier, location=written.location, checksum=written.checksum, state="ready"
            )
            self._enforce_locked({entry.key}, self.clock())
            return entry.tier if self._index.get(entry.key) is entry and entry.has_payload else None

    # ------------------------------------------------------------------ budgets
    def _enforce_locked(self, protect: set[str], now: float, actors: set[str] | None = None) -> None:
        """Shed lowest-score entries until every tier is within budget.

        First pass spares ``protect`` (the entry being placed) and half-written entries; a
        second pass, only if still over budget, spares nothing but pinned entries. Entries of
        tenants other than the ``actors`` (default: the tenants of ``protect``) are shed only
        down to their tenant's reserve."""
        if actors is None:
            actors = {self._index[k].tenant for k in protect if k in self._index}
        self._shrink_memory(self.gpu, protect, now, actors)
        self._shrink_memory(self.cpu, protect, now, actors)
        self._shrink_disk(protect, now, actors)

    def _shrink_memory(self, tier: MemoryTier, protect: set[str], now: float, actors: set[str]) -> None:
        for strict in (True, False):
            over = tier.used - tier.budget
            if over <= 0:
                return
            cands = [
                e
                for e in (self._index[k] for k in tier.held_keys() if k in self._index)
                if not e.pinned and (not strict or (e.key not in protect and e.state != "writing"))
            ]
            usage = self._usage(tier.name, _nbytes)
            reserve = lambda t: self.shares.reserve(t, tier.budget)  # noqa: E731
            for e in fair_victims(
                self.policy, cands, over, now, actors=actors, usage=usage, reserve=reserve, size_of=_nbytes
            ):
                self._demote_locked(e, tier)

    def _demote_locked(self, e: IndexEntry, tier: MemoryTier) -> None:
        tensors = tier.pop(e.key)
        self._tier_evictions[tier.name] += 1
        if tier is self.gpu and tensors is not None and self._room(self.cpu, e):
            self.cpu.put(e.key, tensors)
            e.mem_tier = "cpu"
        else:
            e.mem_tier = None
        self._settle_locked(e)

    def _shrink_disk(self, protect: set[str], now: float, actors: set[str]) -> None:
        for strict in (True, False):
            over = self.disk.used - self.disk.budget
            if over <= 0:
                return
            cands = [
                e
                for e in self._index.values()
                if e.location and e.state == "ready" and not e.pinned and (not strict or e.key not in protect)
            ]
            usage = self._usage("disk", _file_bytes)
            reserve = lambda t: self.shares.reserve(t, self.disk.budget)  # noqa: E731
            victims = fair_victims(
                self.policy, cands, over, now, actors=actors, usage=usage, reserve=reserve, size_of=_file_bytes
            )
            for e in victims:
                self.disk.remove(e.location)
                self.disk.used -= e.file_bytes
                e.location, e.checksum, e.file_bytes = None, None, 0
                self._tier_evictions["disk"] += 1
                self._settle_locked(e)

    # ------------------------------------------------------------------ removal
    def _discard_payload_locked(self, e: IndexEntry) -> None:
        """Free every copy of ``e``'s payload (memory and disk)."""
        self.gpu.pop(e.key)
        self.cpu.pop(e.key)
        if e.location is not None:
            self.disk.remove(e.location)
            self.disk.used -= e.file_bytes
        e.mem_tier, e.location, e.checksum, e.file_bytes = None, None, None, 0

    def _drop_payload_locked(self, e: IndexEntry) -> None:
        """Free ``e``'s payload but keep its row (tokens, text, policy, hits, and ``nbytes``: what
        rebuilding it will take): ``tier = none``, resolvable by id and rebuilt by the next
        request that uses it."""
        self._discard_payload_locked(e)
        e.has_payload, e.state = False, "ready"
        self.registry.set_location(e.key, tier="none", location=None, checksum=None, state="ready")

    def _forget_locked(self, key: str) -> None:
        """Remove ``key`` entirely: payload, index record, buffered touches, registry row."""
        e = self._index.pop(key, None)
        if e is not None:
            self._discard_payload_locked(e)
        self._pending.pop(key, None)
        self.registry.delete(key)

    def _maybe_expire_locked(self, now: float) -> None:
        if now - self._last_expire < self.flush_interval_s:
            return
        self._last_expire = now
        dead = [k for k, e in self._index.items() if e.expired(now)]
        for k in dead:
            self._forget_locked(k)
        self._counts["expired"] += len(dead)


def _file_bytes(e: Any) -> int:
    return int(e.file_bytes)


def _nbytes(e: Any) -> int:
    return int(e.nbytes)
