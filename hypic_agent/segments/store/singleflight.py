"""Single flight: concurrent callers needing the same key share one computation.

The first caller of a key (the leader) runs the work; callers arriving while it runs wait on
the same future and receive its result or its exception. Once the flight lands the key is
free again, so a failed computation is retried by the next caller. Threads and asyncio tasks
share flights: ``join`` returns a ``concurrent.futures.Future`` that async code awaits with
``asyncio.wrap_future``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Generic, TypeVar

T = TypeVar("T")


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
