"""Streaming: events from an ``EventSource`` (``api.job_stream.JobStream``) sent as SSE.

When the client goes away (or the stream ends) the source is cancelled, so the scheduler frees the
request's state at its next step; nothing half-done is stored (entries are put whole, before
decoding starts).

SSE framing: each JSON payload is one ``data: {...}\\n\\n`` event; the stream ends with
``data: [DONE]``; an error after the headers went out is sent as ``data: {"error": {...}}``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol, TypeVar

from hypic_agent.api.errors import error_of

log = logging.getLogger("hypic.api.stream")
T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class EventSource(Protocol[T_co]):
    """What ``sse_body`` streams from (``JobStream``): ``next()`` is ``None`` at the end."""

    async def next(self) -> T_co | None: ...

    def cancel(self) -> None: ...


def sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


DONE = sse("[DONE]")


async def sse_body(
    first: T,
    source: EventSource[T],
    render: Callable[[T], list[dict[str, Any]]],
) -> AsyncIterator[bytes]:
    """Events rendered to SSE, starting with ``first`` (already taken off the pump)."""
    try:
        item: T | None = first
        while item is not None:
            for payload in render(item):
                yield sse(payload)
            item = await source.next()
        yield DONE
    except asyncio.CancelledError:
        source.cancel()
        raise
    except Exception as exc:  # after the 200 went out: report in-band
        _, body = error_of(exc)
        log.warning("stream failed: %s", exc)
        yield sse(body)
        yield DONE
    finally:
        source.cancel()  # client gone or done: the scheduler frees the request
