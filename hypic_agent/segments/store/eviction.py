"""Eviction: which entries leave a tier that is over its budget, and where they go.

Cost-aware order (``EvictionPolicy``): keep the entries that save the most prefill time per byte held.

    score = prefill_ms x (1 + hits) x 0.5 ** (idle_s / half_life_s) / nbytes

``prefill_ms`` is what recomputing the entry costs, ``(1 + hits)`` how often it paid off,
the half-life discounts entries not used lately, and the division charges for the bytes
held. The lowest score leaves a tier first (ties: least recently used, then key).
Pinned entries are never candidates; ``Eviction`` filters them out before asking.

``Eviction.enforce`` sheds entries in that order until every tier is within budget (GPU -> CPU,
CPU -> out of memory (still on disk), disk -> file removed), sparing other tenants' entries
while they hold no more than their reserve (``quota.py``); the store then records where each
moved entry lives now (an entry left nowhere keeps its row, ``tier = none``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

from hypic_agent.segments.store.entries import IndexEntry
from hypic_agent.segments.store.memory_tier import MemoryTier
from hypic_agent.segments.store.quota import TenantQuota
from hypic_agent.segments.store.tiers import Tiers
from hypic_agent.segments.store.usage import UsageLog


class Candidate(Protocol):
    key: str
    nbytes: int
    prefill_ms: float
    hits: int
    last_used_at: float


C = TypeVar("C", bound=Candidate)


@dataclass(frozen=True)
class EvictionPolicy:
    half_life_s: float = 600.0
    min_prefill_ms: float = 1e-3  # entries with unknown cost (0 ms) still order by hits and recency

    def score(self, c: Candidate, now: float) -> float:
        idle = max(0.0, now - c.last_used_at)
        recency = 0.5 ** (idle / self.half_life_s)
        saved = max(c.prefill_ms, self.min_prefill_ms) * (1 + c.hits) * recency
        return saved / max(c.nbytes, 1)

    def order(self, candidates: Iterable[C], now: float) -> list[C]:
        """Candidates, first to evict first."""
        return sorted(candidates, key=lambda c: (self.score(c, now), c.last_used_at, c.key))

    def victims(
        self,
        candidates: Iterable[C],
        need_bytes: int,
        now: float,
        size_of: Callable[[C], int] | None = None,
    ) -> list[C]:
        """A prefix of the eviction order that frees at least ``need_bytes`` (all if it cannot)."""
        out: list[C] = []
        freed = 0
        for c in self.order(candidates, now):
            if freed >= need_bytes:
                break
            out.append(c)
            freed += size_of(c) if size_of is not None else c.nbytes
        return out


E = TypeVar("E", bound=IndexEntry)


def fair_victims(
    policy: EvictionPolicy,
    candidates: Iterable[E],
    need: int,
    now: float,
    *,
    actors: set[str],
    usage: Counter[str],
    reserve: Callable[[str], int],
    size_of: Callable[[E], int],
) -> list[E]:
    """Like ``EvictionPolicy.victims``, but an entry of a tenant not in ``actors`` is skipped while
    that tenant holds no more than its reserve (``usage``: bytes per tenant in the tier)."""
    out: list[E] = []
    freed = 0
    for c in policy.order(candidates, now):
        if freed >= need:
            break
        size = size_of(c)
        if actors and c.tenant not in actors and usage[c.tenant] <= reserve(c.tenant):
            continue
        out.append(c)
        usage[c.tenant] -= size
        freed += size
    return out


class Eviction:
    """Keeps every tier within its budget (``SegmentStore.eviction``). Changes the tiers and the
    live index records (``index``, shared with the store) and counts tier evictions in ``usage``;
    the registry is the store's to update. The caller holds the store lock."""

    def __init__(
        self, policy: EvictionPolicy, tiers: Tiers, quota: TenantQuota, usage: UsageLog, index: Mapping[str, IndexEntry]
    ) -> None:
        self.policy = policy
        self.tiers = tiers
        self.quota = quota
        self.usage = usage
        self._index = index

    def enforce(self, protect: set[str], now: float, actors: set[str] | None = None) -> list[IndexEntry]:
        """Shed lowest-score entries until every tier is within budget; returns the entries that
        moved (each once, in the order they first moved).

        First pass spares ``protect`` (the entry being placed) and half-written entries; a
        second pass, only if still over budget, spares nothing but pinned entries. Entries of
        tenants other than the ``actors`` (default: the tenants of ``protect``) are shed only
        down to their tenant's reserve."""
        if actors is None:
            actors = {self._index[k].tenant for k in protect if k in self._index}
        moved: dict[str, IndexEntry] = {}
        self._shrink_memory(self.tiers.gpu, protect, now, actors, moved)
        self._shrink_memory(self.tiers.cpu, protect, now, actors, moved)
        self._shrink_disk(protect, now, actors, moved)
        return list(moved.values())

    def _shrink_memory(
        self, tier: MemoryTier, protect: set[str], now: float, actors: set[str], moved: dict[str, IndexEntry]
    ) -> None:
        for strict in (True, False):
            over = tier.used - tier.budget
            if over <= 0:
                return
            cands = [
                e
                for e in (self._index[k] for k in tier.held_keys() if k in self._index)
                if not e.pinned and (not strict or (e.key not in protect and e.state != "writing"))
            ]
            usage = self.quota.usage(tier.name, _nbytes)
            reserve = lambda t: self.quota.shares.reserve(t, tier.budget)  # noqa: E731
            for e in fair_victims(
                self.policy, cands, over, now, actors=actors, usage=usage, reserve=reserve, size_of=_nbytes
            ):
                self.usage.evicted_from(tier.name)
                self.tiers.demote(e, tier)
                moved.setdefault(e.key, e)

    def _shrink_disk(self, protect: set[str], now: float, actors: set[str], moved: dict[str, IndexEntry]) -> None:
        disk = self.tiers.disk
        for strict in (True, False):
            over = disk.used - disk.budget
            if over <= 0:
                return
            cands = [
                e
                for e in self._index.values()
                if e.location and e.state == "ready" and not e.pinned and (not strict or e.key not in protect)
            ]
            usage = self.quota.usage("disk", _file_bytes)
            reserve = lambda t: self.quota.shares.reserve(t, disk.budget)  # noqa: E731
            victims = fair_victims(
                self.policy, cands, over, now, actors=actors, usage=usage, reserve=reserve, size_of=_file_bytes
            )
            for e in victims:
                self.tiers.remove_file(e)
                self.usage.evicted_from("disk")
                moved.setdefault(e.key, e)


def _file_bytes(e: IndexEntry) -> int:
    return int(e.file_bytes)


def _nbytes(e: IndexEntry) -> int:
    return int(e.nbytes)
