"""``hypic-agent serve``: load the model, open the store, optionally pre-warm segments from a JSON
file, then run uvicorn. Logs are JSON lines on stderr; start-up says what it is doing (fetching,
reading weights, building, pre-warming) with a line every few seconds (``startup.StartupLog``).

With ``Settings.engine_process`` on (``auto``, the default, is on here) the model, the store and the
scheduler live in the engine process (``runtime.core_process``): it is started first, its start-up
stages come to this process's log, the pre-warm goes through it, and the app serves over it; the
app's shutdown (SIGTERM, Ctrl-C) stops it, and it stops by itself if this process dies.

The HTTP transport is uvicorn's h11 protocol with a guard (``GuardedH11Protocol``, built by
``uvicorn_config``): uvicorn times out idle keep-alive connections but never a connection that is
still sending its request headers (a byte every few seconds holds it open forever), so the guard
gives every request's headers ``Settings.header_timeout_s`` from the connection's start or its
previous response (then 408 and close), and answers connections past ``Settings.max_connections``
503 at once. Request bodies are guarded in the app (``middleware.BodyLimitMiddleware``).

The port is bound before the model load (``startup.hold_port``, by the CLI) and that socket is the
one uvicorn serves on, so no other process can take the port in between; ``"listening"`` is
logged once the server accepts connections on it (``ListeningServer``), not before.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import sys
from pathlib import Path
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from hypic_agent.api.logs import configure_logging, log_event
from hypic_agent.config import Settings
from hypic_agent.errors import InvalidRequestError
from hypic_agent.startup import StartupLog, hold_port, listen_now

log = logging.getLogger("hypic.serve")


def read_prewarm(path: Path) -> list[dict[str, Any]]:
    """A JSON list of wire segments, or ``{"segments": [...]}``."""
    data = json.loads(path.read_text())
    items = data.get("segments") if isinstance(data, dict) else data
    if not isinstance(items, list) or not all(isinstance(x, dict) for x in items):
        raise InvalidRequestError(f"{path}: expected a JSON list of segments or {{'segments': [...]}}", param="prewarm")
    return items


def _raw_response(status: int, reason: str, type_: str, message: str, extra: str = "") -> bytes:
    body = json.dumps({"error": {"type": type_, "message": message, "param": None}}).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        f"connection: close\r\n{extra}\r\n"
    )
    return head.encode("ascii") + body


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a header deadline and a connection cap (module doc). Configure
    a subclass with ``guarded_protocol``; the class attributes are its settings."""

    header_timeout_s: float = 30.0
    max_connections: int = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._inner_app = self.app
        self.app = self._guarded_app
        self._header_timer: asyncio.TimerHandle | None = None
        self._got_bytes = False

    async def _guarded_app(self, scope: Any, receive: Any, send: Any) -> None:
        self._disarm()  # the headers are complete: the request is the app's now
        await self._inner_app(scope, receive, send)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.max_connections and len(self.connections) > self.max_connections:
            message = (
                f"the server has {len(self.connections) - 1} open connections, its limit "
                "(HYPIC_MAX_CONNECTIONS); retry in a moment"
            )
            transport.write(_raw_response(503, "Service Unavailable", "overloaded", message, "retry-after: 1\r\n"))
            transport.close()
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        self._got_bytes = self._got_bytes or bool(data)
        super().data_received(data)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()  # the next request's headers have header_timeout_s from now

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._got_bytes = False
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_timed_out)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_timed_out(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or (self.cycle is not None and not self.cycle.response_complete):
            return  # closed already, or a request is being served
        if self._got_bytes:  # a request began but its headers never ended
            message = (
                f"the request headers did not arrive within {self.header_timeout_s:g} s; the connection is "
                "closed (HYPIC_HEADER_TIMEOUT_S)"
            )
            self.transport.write(_raw_response(408, "Request Timeout", "request_timeout", message))
        self.transport.close()


def guarded_protocol(settings: Settings) -> type[GuardedH11Protocol]:
    """``GuardedH11Protocol`` with ``settings``' header timeout and connection cap."""
    attrs = {"header_timeout_s": settings.header_timeout_s, "max_connections": settings.max_connections}
    return type("GuardedH11Protocol", (GuardedH11Protocol,), attrs)


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """``uvicorn.run`` / ``uvicorn.Config`` keywords: the guarded transport (module doc), no uvicorn
    logging config or access log (the app logs each request)."""
    return {
        "host": settings.host,
        "port": settings.port,
        "log_config": None,
        "access_log": False,
        "http": guarded_protocol(settings),
    }


def uvicorn_config(app: Any, settings: Settings, **overrides: Any) -> Any:
    """The ``uvicorn.Config`` that serves ``app`` (``uvicorn_options``; ``overrides`` win)."""
    import uvicorn

    return uvicorn.Config(app, **{**uvicorn_options(settings), **overrides})


def _address(sock: socket.socket) -> tuple[str, int]:
    host, port = sock.getsockname()[:2]
    return str(host), int(port)


class ListeningServer(uvicorn.Server):
    """A ``uvicorn.Server`` run on one socket from ``startup.hold_port`` (``run(sockets=[sock])``):
    the socket listens as the server starts (just before the app's lifespan start-up, so a client
    that connects meanwhile waits in the backlog), and ``"listening"`` is logged once uvicorn
    serves connections on it."""

    def __init__(self, config: Any, sock: socket.socket) -> None:
        super().__init__(config)
        self.sock = sock

    def run(self, sockets: list[socket.socket] | None = None) -> None:
        super().run(sockets=[self.sock] if sockets is None else sockets)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        for sock in sockets or ():
            listen_now(sock, self.config.backlog)
        await super().startup(sockets=sockets)
        if self.started:
            host, port = _address(self.sock)
            url_host = f"[{host}]" if ":" in host else host
            log_event(log, "listening", host=host, port=port, url=f"http://{url_host}:{port}")


def make_server(app: Any, settings: Settings, sock: socket.socket, **overrides: Any) -> ListeningServer:
    """The server of ``app`` on ``sock`` (``uvicorn_config``; ``overrides`` win)."""
    host, port = _address(sock)
    return ListeningServer(uvicorn_config(app, settings, host=host, port=port, **overrides), sock)


def run_server(
    settings: Settings, *, prewarm: Path | None = None, tenant: str = "default", sock: socket.socket | None = None
) -> None:
    """Load, open the store, pre-warm, warm up (``Settings.warm_start``), then serve on ``sock`` (bound
    by the caller before all that, ``startup.hold_port``; bound here first when not given). For the
    whole run, before any Triton kernel is imported, Triton keeps its compiled kernels and autotune
    results in ``<home>/triton`` (``warm_start.persisted_compile_cache``)."""
    from hypic_agent.runtime.warm_start import persisted_compile_cache

    with persisted_compile_cache(settings.home) as triton_env:
        _serve(settings, prewarm, tenant, sock, triton_env.get("TRITON_CACHE_DIR"))


def _serve(
    settings: Settings, prewarm: Path | None, tenant: str, sock: socket.socket | None, triton_dir: str | None
) -> None:
    from hypic_agent.api.app import create_app
    from hypic_agent.api.metrics import Metrics
    from hypic_agent.api.state import ServerState
    from hypic_agent.runtime.loader import load_engine
    from hypic_agent.runtime.main_thread import off_main_thread
    from hypic_agent.runtime.serving import Serving
    from hypic_agent.runtime.warm_start import warm_start_stage
    from hypic_agent.segments.store.segment_store import SegmentStore

    configure_logging(settings.log_level)
    items = read_prewarm(prewarm) if prewarm is not None else None  # a bad file fails before loading
    sock = hold_port(settings.host, settings.port) if sock is None else sock
    if settings.engine_process is not False:
        try:
            _serve_with_core(settings, items, tenant, sock, triton_dir)
        finally:
            sock.close()
        return
    try:
        with StartupLog() as progress:

            def start_up() -> tuple[Any, Any]:
                progress(f"starting: model {settings.model}, home {settings.home}")
                engine = load_engine(settings, progress=progress)
                progress(f"opening the segment store under {settings.resolved_store_dir()}")
                store = SegmentStore.from_settings(settings)
                if items is not None:
                    state = ServerState.build(settings, engine, store, Metrics(), owns_store=False)
                    _prewarm_items(state, items, tenant, progress)
                warm_start_stage(Serving.of(engine), progress, triton_dir)
                return engine, store

            # on a thread that exits: the main thread keeps no OpenMP pool that slows the engine thread
            engine, store = off_main_thread(start_up)
            progress.done(f"model {engine.name} ready, {store.stats().entries} stored entries")
        app = create_app(settings, engine=engine, store=store, close_store=True, warm=True)  # closed by the lifespan
        server = make_server(app, settings, sock)
        # NOTE: uvicorn re-raises SIGTERM/SIGINT after a graceful shutdown, so nothing after run() is reached
        server.run()
    finally:
        sock.close()
    if not server.started:  # as uvicorn.run: the app's start-up failed (logged)
        sys.exit(3)


def _prewarm_items(state: Any, items: list[dict[str, Any]], tenant: str, progress: Any) -> None:
    """The operator's ``--prewarm`` segments, PUT one by one (no store caps), with counted progress."""
    from hypic_agent.api.limits import StoreBudget
    from hypic_agent.api.schemas import PutSegmentsRequest
    from hypic_agent.api.segments_service import put_segments

    state.store_budget = StoreBudget(state.store_budget.size, 0, 0)  # the operator's pre-warm: no caps
    for i, item in enumerate(items):
        progress(f"pre-warming {len(items)} segments", done=i, total=len(items), unit="segments")
        put_segments(state, PutSegmentsRequest.model_validate({"segments": [item]}), tenant)
    progress(f"pre-warming {len(items)} segments", done=len(items), total=len(items), unit="segments")


def _serve_with_core(
    settings: Settings, items: list[dict[str, Any]] | None, tenant: str, sock: socket.socket, triton_dir: str | None
) -> None:
    """``_serve`` with the engine in its own process (``Settings.engine_process``)."""
    from hypic_agent.api.app import create_app
    from hypic_agent.api.metrics import Metrics
    from hypic_agent.api.state import ServerState
    from hypic_agent.runtime.core_process import EngineClient

    with StartupLog() as progress:
        progress(f"starting: model {settings.model}, home {settings.home}")
        core = EngineClient.start(settings, progress=progress, warm_start=True, triton_dir=triton_dir, log_json=True)
        try:
            state = ServerState.remote(settings, core, Metrics())
            if items is not None:
                _prewarm_items(state, items, tenant, progress)
            entries = state.store.stats().entries
        except BaseException:
            core.close()
            raise
        progress.done(f"model {core.facts.name if core.facts else settings.model} ready, {entries} stored entries")
    app = create_app(settings, core=core, warm=True)  # the lifespan's end stops the engine process
    server = make_server(app, settings, sock)
    try:
        # NOTE: uvicorn re-raises SIGTERM/SIGINT after a graceful shutdown, so nothing after run() is reached
        server.run()
    finally:
        if not server.started:
            core.close()  # the app never started: its lifespan will not stop the engine process
    if not server.started:  # as uvicorn.run: the app's start-up failed (logged)
        sys.exit(3)
