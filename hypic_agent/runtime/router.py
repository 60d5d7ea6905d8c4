"""Router: check every segment of a plan against the entry cache, and balance cold work.

Cold segments are assigned to scatter workers by LPT (longest processing time first, greedy onto
the least-loaded worker, counting the work already queued on each), with each segment's cost
estimated by ``CostModel`` (``a + b*L + c*L^2`` ms, fitted to measured batch build times);
round-robin is kept for comparison (``Settings.scatter_policy``).
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hypic_agent.runtime.hypic.cache import EntryCache
from hypic_agent.runtime.hypic.entry import SegmentEntry


@dataclass
class Route:
    """Per plan segment: its key (None = never cached: too short / BOS / last-as-suffix)."""

    keys: list[str | None]
    entries: list[SegmentEntry | None]  # hits filled in; cold ones filled after scatter
    tiers: list[str | None]
    cold: list[int]  # plan indices to prefill (first occurrence of each cold key)


def route(keys: Sequence[str | None], cache: EntryCache, *, count: bool = True) -> Route:
    """Each key looked up in ``cache``; ``count=False`` for a request's re-reads after its first
    lookup (the store counts one hit per request that used an entry)."""
    entries: list[SegmentEntry | None] = []
    tiers: list[str | None] = []
    cold: list[int] = []
    seen: set[str] = set()
    for i, k in enumerate(keys):
        if k is None:
            entries.append(None)
            tiers.append(None)
            continue
        hit = cache.lookup(k) if count else cache.lookup(k, count=False)
        entries.append(hit.entry)
        tiers.append(hit.tier)
        if hit.entry is None and k not in seen:
            cold.append(i)
            seen.add(k)
    return Route(list(keys), entries, tiers, cold)


def lpt_assign(costs: Sequence[float], workers: int, loads: Sequence[float] | None = None) -> list[list[int]]:
    """Indices of ``costs`` grouped per worker, longest first onto the least-loaded worker;
    ``loads``: work already queued per worker (same unit as ``costs``), zero when not given."""
    if workers < 1:
        raise ValueError("need at least one worker")
    start = list(loads) if loads is not None else [0.0] * workers
    if len(start) != workers:
        raise ValueError(f"{len(start)} loads for {workers} workers")
    heap = [(float(start[w]), w) for w in range(workers)]
    heapq.heapify(heap)
    groups: list[list[int]] = [[] for _ in range(workers)]
    for i in sorted(range(len(costs)), key=lambda j: -costs[j]):
        load, w = heapq.heappop(heap)
        groups[w].append(i)
        heapq.heappush(heap, (load + costs[i], w))
    return groups


def round_robin_assign(n: int, workers: int) -> list[list[int]]:
    """Indices ``0..n-1`` dealt to workers in order (the baseline LPT is compared with)."""
    if workers < 1:
        raise ValueError("need at least one worker")
    return [list(range(w, n, workers)) for w in range(workers)]


def makespan(costs: Sequence[float], groups: Sequence[Sequence[int]], loads: Sequence[float] | None = None) -> float:
    """The finish time of the busiest worker when each runs its group one after another."""
    start = list(loads) if loads is not None else [0.0] * len(groups)
    return max((start[w] + sum(costs[i] for i in g) for w, g in enumerate(groups)), default=0.0)


class CostModel:
    """Estimated build time of a segment of ``L`` tokens: ``a + b*L + c*L^2`` ms.

    Fitted by least squares to measured batch build times: a batch of segments ``L_1..L_k`` took
    ``sum_i (a + b*L_i + c*L_i^2)``, which is linear in ``(a, b, c)`` with features
    ``(k, sum L, sum L^2)``. The fit is a ridge regression pulled towards ``prior`` (so it is
    defined from the first measurement on, and the prior fades as measurements accumulate), on
    columns scaled to one magnitude; coefficients are kept non-negative. Thread-safe.
    """

    def __init__(self, prior: tuple[float, float, float] = (1.0, 0.02, 2e-6), strength: float = 1e-3, keep: int = 256):
        self.prior = np.asarray(prior, dtype=np.float64)
        self.coef = self.prior.copy()
        self.strength = strength
        self.keep = keep
        self._x: list[tuple[float, float, float]] = []
        self._y: list[float] = []
        self._lock = threading.Lock()

    def predict(self, length: int) -> float:
        a, b, c = self.coef
        return float(a + b * length + c * length * length)

    def observe(self, lengths: Sequence[int], ms: float) -> None:
        """Record that one batch of segments of ``lengths`` took ``ms``, and refit."""
        feats = (float(len(lengths)), float(sum(lengths)), float(sum(n * n for n in lengths)))
        with self._lock:
            self._x.append(feats)
            self._y.append(float(ms))
            del self._x[: -self.keep], self._y[: -self.keep]
            self.coef = self._fit()

    @property
    def n_observations(self) -> int:
        return len(self._y)

    def _fit(self) -> np.ndarray:
        x, y = np.asarray(self._x), np.asarray(self._y)
        scale = np.maximum(np.abs(x).max(axis=0), 1e-12)
        xs = x / scale
        lam = np.sqrt(self.strength)
        a = np.vstack([xs, lam * np.eye(3)])
        b = np.concatenate([y, lam * self.prior * scale])
        w = np.linalg.lstsq(a, b, rcond=None)[0] / scale
        return np.maximum(w, 0.0)
