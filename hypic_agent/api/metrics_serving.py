"""``/metrics`` of the serving core, read from the scheduler at scrape time: queue and running
requests, state-pool use (slots, KV pages, bytes), the engine thread's work counters, and the
scatter workers (when ``scatter_workers > 1``): live workers, entries built, failures, restarts."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from hypic_agent.runtime.scheduler.scheduler import Scheduler
from hypic_agent.runtime.workers.pool import WorkerPool


class ServingCollector:
    def __init__(self, scheduler: Scheduler, scatter: WorkerPool | None = None) -> None:
        self.scheduler = scheduler
        self.scatter = scatter

    def describe(self) -> list[Any]:
        return []  # collected at scrape time only

    def collect(self) -> Iterator[Any]:
        sched = self.scheduler
        snap = sched.snapshot()
        requests = GaugeMetricFamily("hypic_scheduler_requests", "requests in the scheduler by state", labels=["state"])
        for state in ("waiting", "preparing", "running"):
            requests.add_metric([state], snap[state])
        yield requests
        u = sched.pool.usage()
        yield GaugeMetricFamily("hypic_pool_slots_used", "linear-state slots held by requests", value=u.slots_used)
        yield GaugeMetricFamily("hypic_pool_slots_total", "linear-state slots in the pool", value=u.slots_total)
        yield GaugeMetricFamily("hypic_pool_pages_used", "attention KV pages held by requests", value=u.pages_used)
        yield GaugeMetricFamily("hypic_pool_pages_total", "attention KV pages in the pool", value=u.pages_total)
        yield GaugeMetricFamily("hypic_pool_page_tokens", "token rows per KV page", value=u.page_size)
        yield GaugeMetricFamily("hypic_pool_bytes", "bytes preallocated by the state pool", value=u.bytes_total)
        st = sched.stats
        for name, help_ in (
            ("forwards", "runner forwards (one per scheduler step with rows)"),
            ("decode_tokens", "tokens decoded in batched steps"),
            ("prefill_tokens", "prompt tokens prefilled in chunks"),
            ("finished", "requests finished"),
            ("cancelled", "requests cancelled (client gone) and freed"),
            ("failed", "requests ended by an error"),
        ):
            yield CounterMetricFamily(f"hypic_scheduler_{name}", help_, value=getattr(st, name))
        if (pool := self.scatter) is not None:
            yield GaugeMetricFamily(
                "hypic_scatter_workers", "scatter worker processes started", value=len(pool.workers)
            )
            yield GaugeMetricFamily(
                "hypic_scatter_workers_alive", "scatter workers ready for jobs", value=len(pool.alive())
            )
            ps = pool.stats
            for name, help_ in (
                ("entries", "entries built on scatter workers"),
                ("failures", "scatter workers that died or timed out during a build"),
                ("restarts", "scatter workers restarted after a failure"),
                ("rebuilt_locally", "segments rebuilt on rank 0 because their worker failed"),
            ):
                yield CounterMetricFamily(f"hypic_scatter_{name}", help_, value=getattr(ps, name))
