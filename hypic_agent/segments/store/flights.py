"""``get_or_compute``: a lookup in the store, or one computation of the entry however many callers
miss it at once (a ``SingleFlight`` per key), stored with ``put`` before the flight lands.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from hypic_agent.segments.store.entries import EntryMeta, Fetch, Tensors
from hypic_agent.segments.store.singleflight import SingleFlight

Compute = Callable[[], tuple[Tensors, EntryMeta]]
AsyncCompute = Callable[[], tuple[Tensors, EntryMeta] | Awaitable[tuple[Tensors, EntryMeta]]]
Get = Callable[..., tuple[Tensors, str] | None]
"""``SegmentStore.get``: ``(key, *, tenant=, model_fingerprint=, token_digest=)``."""
Put = Callable[[str, Tensors, EntryMeta], str | None]


class StoreFlights:
    """``get_or_compute`` for ``SegmentStore`` (``SegmentStore.flights``): concurrent misses of one
    key share one compute. ``get`` / ``put`` are the store's own."""

    def __init__(self, get: Get, put: Put) -> None:
        self.get = get
        self.put = put
        self._flight: SingleFlight[Fetch] = SingleFlight()

    def in_flight(self) -> int:
        return self._flight.in_flight()

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
        compute: AsyncCompute,
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
