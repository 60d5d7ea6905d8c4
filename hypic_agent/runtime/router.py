"""Router: check every segment of a plan against the entry cache, and balance cold work.

Cold segments are assigned to scatter workers by LPT (longest processing time first, greedy onto
the least-loaded worker), using the segment's token count as its estimated cost.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from hypic_agent.runtime.hypic.cache import EntryCache
from hypic_agent.runtime.hypic.entry import SegmentEntry


@dataclass
class Route:
    """Per plan segment: its key (None = never cached: too short / BOS / last-as-suffix)."""

    keys: list[str | None]
    entries: list[SegmentEntry | None]  # hits filled in; cold ones filled after scatter
    tiers: list[str | None]
    cold: list[int]  # plan indices to prefill (first occurrence of each cold key)


def route(keys: Sequence[str | None], cache: EntryCache) -> Route:
    entries: list[SegmentEntry | None] = []
    tiers: list[str | None] = []
    cold: list[int] = []
    seen: set[str] = set()
    for i, k in enumerate(keys):
        if k is None:
            entries.append(None)
            tiers.append(None)
            continue
        hit = cache.lookup(k)
        entries.append(hit.entry)
        tiers.append(hit.tier)
        if hit.entry is None and k not in seen:
            cold.append(i)
            seen.add(k)
    return Route(list(keys), entries, tiers, cold)


def lpt_assign(costs: Sequence[float], workers: int) -> list[list[int]]:
    """Indices of ``costs`` grouped per worker, longest first onto the least-loaded worker."""
    if workers < 1:
        raise ValueError("need at least one worker")
    heap = [(0.0, w) for w in range(workers)]
    groups: list[list[int]] = [[] for _ in range(workers)]
    for i in sorted(range(len(costs)), key=lambda j: -costs[j]):
        load, w = heapq.heappop(heap)
        groups[w].append(i)
        heapq.heappush(heap, (load + costs[i], w))
    return groups
