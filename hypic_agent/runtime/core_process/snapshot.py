"""``ServingSnapshot``: the serving core's numbers at one instant (scheduler queues, state-pool use,
the engine thread's counters, the scatter workers, cold stores), what ``/metrics`` shows of it.

Plain values, so the same snapshot is read in-process (``ServingSnapshot.of``) or asked of the
engine process over the pipe (``EngineClient.snapshot``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

COUNTERS = ("forwards", "decode_tokens", "prefill_tokens", "finished", "cancelled", "failed")
SCATTER_COUNTERS = ("entries", "failures", "restarts", "rebuilt_locally")


@dataclass(frozen=True)
class ServingSnapshot:
    requests: dict[str, int]  # ``Scheduler.snapshot()``: waiting / running / preparing, slots, pages, prefixes
    slots_used: int
    slots_total: int
    pages_used: int
    pages_total: int
    page_size: int
    pool_bytes: int
    counters: dict[str, int]  # ``COUNTERS`` of ``SchedulerStats``
    scatter: dict[str, int] | None = None  # workers, alive and ``SCATTER_COUNTERS``; None without workers
    cold_inserts: int = 0  # entries stored by cold builds (one per cold segment)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, scheduler: Any, scatter: Any = None, cold_inserts: int = 0) -> ServingSnapshot:
        u = scheduler.pool.usage()
        st = scheduler.stats
        workers = None
        if scatter is not None:
            ps = scatter.stats
            workers = {"workers": len(scatter.workers), "alive": len(scatter.alive())}
            workers.update({name: int(getattr(ps, name)) for name in SCATTER_COUNTERS})
        return cls(
            requests=dict(scheduler.snapshot()),
            slots_used=u.slots_used,
            slots_total=u.slots_total,
            pages_used=u.pages_used,
            pages_total=u.pages_total,
            page_size=u.page_size,
            pool_bytes=u.bytes_total,
            counters={name: int(getattr(st, name)) for name in COUNTERS},
            scatter=workers,
            cold_inserts=cold_inserts,
        )
