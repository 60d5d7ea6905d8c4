"""Cost-aware eviction: keep the entries that save the most prefill time per byte held.

    score = prefill_ms x (1 + hits) x 0.5 ** (idle_s / half_life_s) / nbytes

``prefill_ms`` is what recomputing the entry costs, ``(1 + hits)`` how often it paid off,
the half-life discounts entries not used lately, and the division charges for the bytes
held. The lowest score leaves a tier first (ties: least recently used, then key).
Pinned entries are never candidates; the store filters them out before asking.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar


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
