"""Pure-ASGI middleware (streaming-safe): request bodies (size 413, read timeout 408, bytes held at
once 503), request id, access log + metrics, and the last-resort guard that turns any exception into
a 500 envelope. Slow or unfinished headers are the transport's (``serve.GuardedH11Protocol``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hypic_agent.api.errors import envelope
from hypic_agent.api.logs import log_event

log = logging.getLogger("hypic.api.access")
error_log = logging.getLogger("hypic.api")


class InflightBytes:
    """Request body bytes held at once by requests not yet answered (``limit`` 0: unlimited). Used on
    the event loop only (no lock)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def take(self, n: int, mine: int = 0) -> bool:
        """Hold ``n`` more bytes for a request that holds ``mine`` already, if they fit (a request is
        always let in when no other request holds anything)."""
        if self.limit and self.held > mine and self.held + n > self.limit:
            return False
        self.held += n
        return True

    def give(self, n: int) -> None:
        self.held -= n


class BodyLimitMiddleware:
    """Guards request bodies: over ``max_bytes`` is 413 (by ``Content-Length`` up front, else while
    reading); a body that has not arrived ``timeout_s`` after the headers is 408 and the connection
    is closed; a request whose body would take the bytes held by unanswered requests past
    ``inflight.limit`` is 503 ``overloaded`` with ``Retry-After`` (declared lengths are held from
    the start, chunked bodies as they arrive; released when the request has been answered)."""

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        on_error: Any = None,
        timeout_s: float | None = None,
        inflight: InflightBytes | None = None,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.on_error = on_error
        self.timeout_s = timeout_s
        self.inflight = inflight or InflightBytes(0)

    def _message(self, size: int | None) -> str:
        got = f" ({size} bytes)" if size is not None else ""
        return (
            f"request body is over the limit of {self.max_bytes} bytes{got}; store long segments once with "
            "PUT /v1/segments and refer to them by id, or raise HYPIC_MAX_BODY_BYTES"
        )

    def _busy(self) -> str:
        return (
            f"the server is holding {self.inflight.held} bytes of request bodies, its limit is {self.inflight.limit} "
            "(HYPIC_MAX_INFLIGHT_BODY_BYTES); retry in a moment"
        )

    async def _refuse(self, send: Send, status: int, type_: str, message: str, headers: dict[str, str]) -> None:
        await _send_json(send, status, envelope(type_, message), headers)
        if self.on_error is not None:
            self.on_error(type_)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        declared = int(length) if length is not None and length.isdigit() else None
        if declared is not None and declared > self.max_bytes:
            await self._refuse(send, 413, "payload_too_large", self._message(declared), {})
            return
        held = declared or 0
        if held and not self.inflight.take(held):
            await self._refuse(send, 503, "overloaded", self._busy(), {"Retry-After": "1"})
            return
        seen = 0
        done = declared == 0
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s

        async def guarded() -> Message:
            nonlocal seen, held, done
            if done or deadline is None:
                msg = await receive()
            else:
                try:
                    msg = await asyncio.wait_for(receive(), max(deadline - time.monotonic(), 0.0))
                except TimeoutError:
                    raise HTTPException(
                        408,
                        f"the request body did not arrive within {self.timeout_s:g} s of its headers "
                        f"({seen} bytes came); the connection is closed (HYPIC_BODY_TIMEOUT_S)",
                        headers={"Connection": "close"},
                    ) from None
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                done = not msg.get("more_body", False)
                if seen > self.max_bytes:
                    raise HTTPException(413, self._message(None))
                if seen > held:  # a chunked body: hold what came beyond the declared length
                    if not self.inflight.take(seen - held, mine=held):
                        raise HTTPException(503, self._busy(), headers={"Retry-After": "1"})
                    held = seen
            elif msg["type"] == "http.disconnect":
                done = True
            return msg

        try:
            await self.app(scope, guarded, send)
        finally:
            self.inflight.give(held)


class ErrorGuardMiddleware:
    """Any exception the app lets out becomes a 500 with the error envelope, logged with the request id.

    Nothing propagates to the server, so the connection stays open (uvicorn closes a keep-alive
    connection on an exception from the app). If the response had already started, its body is
    ended cleanly instead. Sits inside ``AccessLogMiddleware`` (which assigns the request id)."""

    def __init__(self, app: ASGIApp, on_error: Any = None) -> None:
        self.app = app
        self.on_error = on_error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = finished = False

        async def send_tracked(msg: Message) -> None:
            nonlocal started, finished
            if msg["type"] == "http.response.start":
                started = True
            elif msg["type"] == "http.response.body" and not msg.get("more_body", False):
                finished = True
            await send(msg)

        try:
            await self.app(scope, receive, send_tracked)
        except Exception:
            rid = (scope.get("state") or {}).get("request_id")
            error_log.error(
                "unhandled error on %s %s",
                scope.get("method"),
                scope.get("path"),
                exc_info=True,
                extra={"fields": {"request_id": rid, "response_started": started}},
            )
            if self.on_error is not None:
                self.on_error("internal_error")
            with contextlib.suppress(Exception):  # the client may be gone
                if not started:
                    msg = f"internal server error (request id {rid}); see the server log"
                    await _send_json(send, 500, envelope("internal_error", msg))
                elif not finished:
                    await send({"type": "http.response.body", "body": b"", "more_body": False})


class AccessLogMiddleware:
    """Adds ``x-request-id``; logs one JSON line per request; feeds request count / latency metrics."""

    def __init__(self, app: ASGIApp, metrics: Any = None) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = _request_id(dict(scope.get("headers") or []).get(b"x-request-id", b""))
        scope.setdefault("state", {})["request_id"] = rid
        t0 = time.perf_counter()
        status = 500

        async def send_wrapped(msg: Message) -> None:
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]
                msg.setdefault("headers", [])
                msg["headers"] = [*msg["headers"], (b"x-request-id", rid.encode())]
            await send(msg)

        try:
            await self.app(scope, receive, send_wrapped)
        finally:
            ms = (time.perf_counter() - t0) * 1e3
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            if self.metrics is not None:
                self.metrics.requests.labels(route, str(status)).inc()
                self.metrics.latency.labels(route).observe(ms / 1e3)
            state = scope.get("state") or {}
            log_event(
                log,
                "request",
                request_id=rid,
                method=scope.get("method"),
                path=scope.get("path"),
                route=route,
                status=status,
                ms=round(ms, 2),
                tenant=state.get("tenant"),
            )


def _request_id(given: bytes) -> str:
    """The client's ``x-request-id`` if it is a short printable ASCII token, else a fresh one."""
    if 0 < len(given) <= 128 and all(0x21 <= b <= 0x7E for b in given):
        return given.decode("ascii")
    return uuid.uuid4().hex[:16]


async def _send_json(send: Send, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
    data = json.dumps(body).encode()
    extra = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()), *extra],
        }
    )
    await send({"type": "http.response.body", "body": data})
