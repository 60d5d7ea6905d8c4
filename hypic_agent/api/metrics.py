"""Prometheus metrics (``hypic_`` prefix), one ``CollectorRegistry`` per app.

Request-path metrics are updated as requests run; store-side numbers (bytes and entries per
tier, evictions, corrupt / rejected entries) are read from ``SegmentStore.stats()`` at scrape
time by a custom collector, so they are always current. No label carries a tenant name unless
``tenant_labels`` (``Settings.metrics_tenant_labels``) is on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class _StoreCollector(Collector):
    def __init__(self, stats: Callable[[], Any]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Any]:
        st = self._stats()
        if st is None:
            return
        nbytes = GaugeMetricFamily("hypic_tier_bytes", "bytes held per store tier", labels=["tier"])
        budget = GaugeMetricFamily("hypic_tier_budget_bytes", "byte budget per store tier", labels=["tier"])
        entries = GaugeMetricFamily("hypic_tier_entries", "entries held per store tier", labels=["tier"])
        evict = CounterMetricFamily("hypic_evictions", "entries shed from a tier for lack of budget", labels=["tier"])
        for name, t in st.tiers.items():
            nbytes.add_metric([name], t.bytes)
            budget.add_metric([name], t.budget)
            entries.add_metric([name], t.entries)
            evict.add_metric([name], t.evictions)
        yield from (nbytes, budget, entries, evict)
        yield GaugeMetricFamily("hypic_store_entries", "entries in the store (all tiers)", value=st.entries)
        for name in ("evicted", "expired", "corrupt", "rejected"):
            yield CounterMetricFamily(f"hypic_store_{name}", f"store entries {name}", value=getattr(st, name))
        lookups = CounterMetricFamily("hypic_store_lookups", "store lookups by result", labels=["result"])
        lookups.add_metric(["hit"], st.hits)
        lookups.add_metric(["miss"], st.misses)
        yield lookups


class Metrics:
    """All metrics of one app. ``render()`` is the ``/metrics`` body."""

    def __init__(self, store_stats: Callable[[], Any] | None = None, *, tenant_labels: bool = False) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("hypic_requests", "HTTP requests", ["route", "status"], registry=r)
        self.latency = Histogram(
            "hypic_request_seconds",
            "request latency (to the last byte)",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "hypic_ttft_seconds", "time to first token", ["mode"], buckets=_LATENCY_BUCKETS, registry=r
        )
        self.errors = Counter("hypic_errors", "error responses by error type", ["type"], registry=r)
        self.segments = Counter("hypic_segments", "prompt segments served, by result", ["result"], registry=r)
        self.hit_ratio = Gauge("hypic_segment_hit_ratio", "cached segments / cacheable segments (lifetime)", registry=r)
        self.cold = Counter("hypic_cold_segments", "segments prefilled cold (one per store insert)", registry=r)
        self.tokens = Counter("hypic_tokens", "prompt tokens by how they were served", ["kind"], registry=r)
        self.queue_depth = Gauge("hypic_queue_depth", "requests waiting for or running on the engine", registry=r)
        self.tenant_labels = tenant_labels
        self.rate_limited = Counter(
            "hypic_rate_limited", "requests refused with 429", ["tenant"] if tenant_labels else [], registry=r
        )
        self.auth_failures = Counter("hypic_auth_failures", "requests with a wrong API key", registry=r)
        self._hit = 0
        self._cacheable = 0
        self.before_render: list[Callable[[], None]] = []  # run before each scrape (the engine process's numbers)
        if store_stats is not None:
            r.register(_StoreCollector(store_stats))

    def count_rate_limited(self, tenant: str) -> None:
        (self.rate_limited.labels(tenant) if self.tenant_labels else self.rate_limited).inc()

    def observe_usage(self, mode: str, segments: list[Any], cached: int, recomputed: int, completion: int) -> None:
        for s in segments:
            if s.hit:
                result = "hit"
            elif s.id is None or mode in ("full_recompute",):
                result = "uncached"
            else:
                result = "miss"
            self.segments.labels(result).inc()
            if result != "uncached":
                self._cacheable += 1
                self._hit += result == "hit"
        if self._cacheable:
            self.hit_ratio.set(self._hit / self._cacheable)
        self.tokens.labels("cached").inc(cached)
        self.tokens.labels("recomputed").inc(recomputed)
        self.tokens.labels("completion").inc(completion)

    def render(self) -> bytes:
        """The ``/metrics`` body (may ask the engine process: call it off the event loop)."""
        for refresh in self.before_render:
            refresh()
        return generate_latest(self.registry)
