"""``/metrics`` of the serving core, read at scrape time: queue and running requests, state-pool use
(slots, KV pages, bytes), the engine thread's work counters, and the scatter workers (when
``scatter_workers > 1``): live workers, entries built, failures, restarts.

The numbers come as one ``ServingSnapshot``: read from the scheduler in-process, or asked of the
engine process (``EngineClient.snapshot``; ``refresh`` before the scrape fetches it once, and a
dead engine process shows no serving metrics rather than failing the scrape)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from hypic_agent.runtime.core_process.snapshot import COUNTERS, ServingSnapshot

_HELP = {
    "forwards": "runner forwards (one per scheduler step with rows)",
    "decode_tokens": "tokens decoded in batched steps",
    "prefill_tokens": "prompt tokens prefilled in chunks",
    "finished": "requests finished",
    "cancelled": "requests cancelled (client gone) and freed",
    "failed": "requests ended by an error",
}
_SCATTER_HELP = {
    "entries": "entries built on scatter workers",
    "failures": "scatter workers that died or timed out during a build",
    "restarts": "scatter workers restarted after a failure",
    "rebuilt_locally": "segments rebuilt on rank 0 because their worker failed",
}


class ServingCollector:
    def __init__(self, snapshot: Callable[[], ServingSnapshot | None]) -> None:
        self.snapshot = snapshot
        self._fresh: ServingSnapshot | None = None
        self._has_fresh = False

    def describe(self) -> list[Any]:
        return []  # collected at scrape time only

    def refresh(self) -> None:
        """Take the snapshot the next ``collect`` shows (``Metrics.before_render``)."""
        self._fresh, self._has_fresh = self.snapshot(), True

    def collect(self) -> Iterator[Any]:
        snap = self._fresh if self._has_fresh else self.snapshot()
        self._fresh, self._has_fresh = None, False
        if snap is None:
            return
        requests = GaugeMetricFamily("hypic_scheduler_requests", "requests in the scheduler by state", labels=["state"])
        for state in ("waiting", "preparing", "running"):
            requests.add_metric([state], snap.requests[state])
        yield requests
        yield GaugeMetricFamily("hypic_pool_slots_used", "linear-state slots held by requests", value=snap.slots_used)
        yield GaugeMetricFamily("hypic_pool_slots_total", "linear-state slots in the pool", value=snap.slots_total)
        yield GaugeMetricFamily("hypic_pool_pages_used", "attention KV pages held by requests", value=snap.pages_used)
        yield GaugeMetricFamily("hypic_pool_pages_total", "attention KV pages in the pool", value=snap.pages_total)
        yield GaugeMetricFamily("hypic_pool_page_tokens", "token rows per KV page", value=snap.page_size)
        yield GaugeMetricFamily("hypic_pool_bytes", "bytes preallocated by the state pool", value=snap.pool_bytes)
        for name in COUNTERS:
            yield CounterMetricFamily(f"hypic_scheduler_{name}", _HELP[name], value=snap.counters[name])
        if (scatter := snap.scatter) is not None:
            started = scatter["workers"]
            yield GaugeMetricFamily("hypic_scatter_workers", "scatter worker processes started", value=started)
            yield GaugeMetricFamily(
                "hypic_scatter_workers_alive", "scatter workers ready for jobs", value=scatter["alive"]
            )
            for name, help_ in _SCATTER_HELP.items():
                yield CounterMetricFamily(f"hypic_scatter_{name}", help_, value=scatter[name])
