"""A *sync* httpx transport into an ASGI app, with the app's lifespan running.

``httpx.ASGITransport`` is async-only, and starlette's TestClient may be built on another httpx
flavour, so the sync client reaches the app through an anyio blocking portal: one event loop on a
helper thread runs the lifespan and every request.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import anyio.from_thread
import httpx


class PortalTransport(httpx.BaseTransport):
    """Runs each request through ``httpx.ASGITransport`` on the portal's event loop."""

    def __init__(self, app: Any, portal: anyio.from_thread.BlockingPortal) -> None:
        self._asgi = httpx.ASGITransport(app=app)
        self._portal = portal

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        async def call() -> httpx.Response:
            body = request.read()
            areq = httpx.Request(request.method, request.url, headers=request.headers, content=body)
            areq.extensions = request.extensions
            resp = await self._asgi.handle_async_request(areq)
            content = b"".join([chunk async for chunk in resp.aiter_raw()])  # raw: keep content-encoding
            return httpx.Response(resp.status_code, headers=resp.headers, content=content)

        return self._portal.call(call)


@contextlib.contextmanager
def app_sync_transport(app: Any) -> Iterator[PortalTransport]:
    """``with app_sync_transport(app) as t: Hypic(transport=t)``: lifespan up for the block."""
    with anyio.from_thread.start_blocking_portal() as portal:
        lifespan = app.router.lifespan_context(app)
        with portal.wrap_async_context_manager(lifespan):
            yield PortalTransport(app, portal)
