"""Single flight: concurrent callers needing the same key share one computation.

The first caller of a key (the leader) runs the work; callers arriving while it runs wait on
the same future and receive its result or its exception. Once the flight lands the key is
free again, so a failed computation is retried by the next caller. Threads and asyncio tasks
share flights: ``join`` returns a ``concurrent.futures.Future`` that async code awaits with
``asyncio.wrap_future``.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Any, Generic, TypeVar

from hypic_agent.segments.store.entries import EntryMeta, Fetch, Tensors

T = TypeVar("T")
Compute = Callable[[], tuple[Tensors, EntryMeta]]
AsyncCompute = Callable[[], tuple[Tensors, EntryMeta] | Awaitable[tuple[Tensors, EntryMeta]]]


class SingleFlight(Generic[T]):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flights: dict[str, Future[T]] = {}

    def join(self, key: str) -> tuple[Future[T], bool]:
        """The flight of ``key`` and whether the caller leads it (and must ``land`` it)."""
        with self._lock:
            fut = self._flights.get(key)
            if fut is not None:
                return fut, False
            fut = Future()
            self._flights[key] = fut
            return fut, True

    def land(self, key: str, fut: Future[T], *, result: T | None = None, error: BaseException | None = None) -> None:
        """Leader only: publish the outcome and free the key."""
        with self._lock:
            if self._flights.get(key) is fut:
                del self._flights[key]
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)  # type: ignore[arg-type]

    def do(self, key: str, fn: Callable[[], T]) -> tuple[T, bool]:
        """Run ``fn`` once per flight; returns (result, whether this caller ran it)."""
        fut, leader = self.join(key)
        if not leader:
            return fut.result(), False
        try:
            value = fn()
        except BaseException as exc:
            self.land(key, fut, error=exc)
            raise
        self.land(key, fut, result=value)
        return value, True

    def in_flight(self) -> int:
        with self._lock:
            return len(self._flights)


class StoreFlights:
    """``get_or_compute`` for ``SegmentStore``: concurrent misses of one key share one compute."""

    _flight: SingleFlight[Fetch]

    def get(
        self,
        key: str,
        *,
        tenant: str | None = None,
        model_fingerprint: str | None = None,
        token_digest: str | None = None,
    ) -> tuple[Tensors, str] | None:
        raise NotImplementedError

    def put(self, key: str, tensors: Tensors, meta: EntryMeta) -> str | None:
        raise NotImplementedError

    def get_or_compute(self, key: str, compute: Compute, **check: Any) -> Fetch:
        """``get``, or run ``compute() -> (tensors, meta)`` once however many threads ask at once."""
        hit = self.get(key, **check)
        if hit is not None:
            return Fetch(hit[0], hit[1], computed=False)
        fut, leader = self._flight.join(key)
        if not leader:
            return _as_waiter(fut.result())
        try:
            result = self._lead(key, compute, check)
        except BaseException as exc:
            self._flight.land(key, fut, error=exc)
            raise
        self._flight.land(key, fut, result=result)
        return result

    async def aget_or_compute(
        self,
        key: str,
        compute: Callable[[], tuple[Tensors, EntryMeta] | Awaitable[tuple[Tensors, EntryMeta]]],
        **check: Any,
    ) -> Fetch:
        """Async twin: waiting never blocks the event loop; ``compute`` may be sync (run in a
        thread) or async. Shares flights with ``get_or_compute``."""
        hit = await asyncio.to_thread(self.get, key, **check)
        if hit is not None:
            return Fetch(hit[0], hit[1], computed=False)
        fut, leader = self._flight.join(key)
        if not leader:
            return _as_waiter(await asyncio.wrap_future(fut))
        try:
            hit = await asyncio.to_thread(self.get, key, **check)
            if hit is not None:
                result = Fetch(hit[0], hit[1], computed=False)
            else:
                if inspect.iscoroutinefunction(compute):
                    tensors, meta = await compute()
                else:
                    out = await asyncio.to_thread(compute)
                    tensors, meta = (await out) if inspect.isawaitable(out) else out
                await asyncio.to_thread(self.put, key, tensors, meta)
                result = Fetch(tensors, None, computed=True)
        except BaseException as exc:
            self._flight.land(key, fut, error=exc)
            raise
        self._flight.land(key, fut, result=result)
        return result

    def _lead(self, key: str, compute: Compute, check: dict[str, Any]) -> Fetch:
        hit = self.get(key, **check)  # landed between our miss and joining the flight
        if hit is not None:
            return Fetch(hit[0], hit[1], computed=False)
        tensors, meta = compute()
        self.put(key, tensors, meta)
        return Fetch(tensors, None, computed=True)


def _as_waiter(f: Fetch) -> Fetch:
    return Fetch(f.tensors, f.tier, computed=f.computed, waited=True)
