"""``/metrics`` of the serving core, read from the scheduler at scrape time: queue and running
requests, state-pool use (slots, KV pages, bytes), and the engine thread's work counters."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from hypic_agent.runtime.scheduler.scheduler import Scheduler


class ServingCollector:
    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

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
