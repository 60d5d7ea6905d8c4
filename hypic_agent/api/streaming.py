"""Streaming: a blocking event iterator run on its own thread, bridged to asyncio, sent as SSE.

``EventPump`` runs ``make_iter()`` on a worker thread and hands items to the event loop through
an ``asyncio.Queue``. ``cancel()`` (client gone) makes the worker stop at the next item and close
the iterator, so the engine's lock is released and nothing half-done is stored (entries are put
whole, before decoding starts).

SSE framing: each JSON payload is one ``data: {...}\\n\\n`` event; the stream ends with
``data: [DONE]``; an error after the headers went out is sent as ``data: {"error": {...}}``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Generic, TypeVar

from hypic_agent.api.errors import error_of

log = logging.getLogger("hypic.api.stream")
T = TypeVar("T")
_END = object()


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class EventPump(Generic[T]):
    def __init__(self, make_iter: Callable[[], Iterator[T]]) -> None:
        self._make_iter = make_iter
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self._cancel = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hypic-stream", daemon=True)
        self._thread.start()

    def _put(self, item: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # loop closed: nobody is listening any more
            self._cancel.set()

    def _run(self) -> None:
        it: Iterator[T] | None = None
        try:
            it = self._make_iter()
            for item in it:
                if self._cancel.is_set():
                    break
                self._put(item)
        except BaseException as exc:  # delivered to the consumer, which re-raises it
            self._put(_Failure(exc))
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                try:
                    close()
                except Exception:
                    log.exception("closing a cancelled stream failed")
            self._put(_END)

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    async def next(self) -> T | None:
        """The next item; ``None`` at the end; re-raises the worker's exception."""
        item = await self._queue.get()
        if item is _END:
            return None
        if isinstance(item, _Failure):
            raise item.exc
        return item

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)


def sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


DONE = sse("[DONE]")


async def sse_body(
    first: T,
    pump: EventPump[T],
    render: Callable[[T], list[dict[str, Any]]],
) -> AsyncIterator[bytes]:
    """Events rendered to SSE, starting with ``first`` (already taken off the pump)."""
    try:
        item: T | None = first
        while item is not None:
            for payload in render(item):
                yield sse(payload)
            item = await pump.next()
        yield DONE
    except asyncio.CancelledError:
        pump.cancel()
        raise
    except Exception as exc:  # after the 200 went out: report in-band
        _, body = error_of(exc)
        log.warning("stream failed: %s", exc)
        yield sse(body)
        yield DONE
    finally:
        pump.cancel()  # client gone or done: stop the worker at its next event
