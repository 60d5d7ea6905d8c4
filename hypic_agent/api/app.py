"""App factory: ``create_app(settings=None, engine=None, store=None, core=None)``.

The lifespan builds what was not injected: the engine (``load_engine``: the configured model,
or the tiny fallback, said so in the log) and the persistent segment store (SQLite registry +
disk tier under ``settings.home`` unless configured otherwise), then wires the engine's entry
cache onto the store (``StoreEntryCache``). A store the app built is closed on shutdown.

With ``Settings.engine_process`` true (and no engine or store injected), or a started ``core``
(``runtime.core_process.EngineClient``, as ``hypic-agent serve`` passes), the engine and the store
live in the engine process instead and the app talks to it over a pipe (``ServerState.remote``); the
lifespan's end stops that process. ``"auto"`` means in-process here: ``serve`` decides for itself.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from hypic_agent.api.auth import FailedKeyLimiter
from hypic_agent.api.errors import install_error_handlers
from hypic_agent.api.logs import log_event
from hypic_agent.api.metrics import Metrics
from hypic_agent.api.middleware import AccessLogMiddleware, BodyLimitMiddleware, ErrorGuardMiddleware, InflightBytes
from hypic_agent.api.routes import chat, completions, generate, segments, system
from hypic_agent.api.state import ServerState
from hypic_agent.api.warm_routes import warm_routes
from hypic_agent.config import Settings, get_settings
from hypic_agent.errors import ServiceUnavailableError
from hypic_agent.runtime.core_process import EngineClient
from hypic_agent.runtime.engine import Engine
from hypic_agent.runtime.warm_start import wants_warm_start
from hypic_agent.segments.store.segment_store import SegmentStore

log = logging.getLogger("hypic.api")


def create_app(
    settings: Settings | None = None,
    engine: Engine | None = None,
    store: SegmentStore | None = None,
    *,
    model: str | None = None,
    close_store: bool | None = None,
    core: EngineClient | None = None,
    warm: bool = False,
) -> FastAPI:
    """A FastAPI app. ``engine`` / ``store`` are built in the lifespan when not given;
    ``model`` overrides ``settings.model`` for the engine built there. The store is closed on
    shutdown when the app built it (or ``close_store=True``); an injected one is only flushed.
    ``core``: a started engine process to serve with (stopped on shutdown); without one, the
    lifespan starts one when ``settings.engine_process`` is true and no engine or store is given.
    ``warm``: the lifespan sends ``api.warm_routes``' requests through the app before it serves when
    ``settings.warm_start`` says so (``auto``: a CUDA engine), as ``serve`` does."""
    settings = settings or get_settings()
    holder: dict[str, ServerState] = {}
    use_core = core is not None or (engine is None and store is None and settings.engine_process is True)

    def store_stats() -> Any:
        st = holder.get("state")
        if st is None:
            return None
        try:
            return st.store.stats()
        except ServiceUnavailableError:  # the engine process is gone: no store numbers this scrape
            return None

    metrics = Metrics(store_stats, tenant_labels=settings.metrics_tenant_labels)

    def _start_core() -> EngineClient:
        return EngineClient.start(settings, model=model)

    async def _local_state() -> ServerState:
        from hypic_agent.runtime.loader import load_engine
        from hypic_agent.runtime.main_thread import off_main_thread

        eng = engine
        if eng is None:
            eng = await run_in_threadpool(lambda: load_engine(settings, model=model))
        if eng.name.startswith("tiny"):
            log_event(log, "serving the tiny random model: its answers are noise", logging.WARNING, model=eng.name)
        st_store = store if store is not None else await run_in_threadpool(SegmentStore.from_settings, settings)
        owns = store is None if close_store is None else close_store
        # the state pool is allocated on a thread that exits: the main thread keeps no OpenMP pool that
        # slows the engine thread on the CPU (``runtime.main_thread``)
        return off_main_thread(lambda: ServerState.build(settings, eng, st_store, metrics, owns_store=owns))

    async def _remote_state(started: EngineClient | None) -> ServerState:
        client = started if started is not None else await run_in_threadpool(_start_core)
        try:
            state = ServerState.remote(settings, client, metrics)
        except BaseException:
            client.close()
            raise
        if state.engine.name.startswith("tiny"):
            name = state.engine.name
            log_event(log, "serving the tiny random model: its answers are noise", logging.WARNING, model=name)
        return state

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = await (_remote_state(core) if use_core else _local_state())
        holder["state"] = state
        app.state.hypic = state
        if warm and wants_warm_start(settings, state.engine.device):
            await warm_routes(app, settings)
        stats = await run_in_threadpool(state.store.stats) if state.core is not None else state.store.stats()
        log_event(
            log,
            "server ready",
            model=state.engine.name,
            fingerprint=state.engine.fingerprint,
            max_context=state.engine.max_context,
            store_entries=stats.entries,
            store_dir=str(settings.resolved_store_dir()),
            auth="open" if state.auth.open else f"{len(settings.api_keys)} keys",
            engine_process=state.core.pid if state.core is not None else None,
        )
        switch = sys.getswitchinterval()
        if settings.switch_interval_ms is not None:
            sys.setswitchinterval(settings.switch_interval_ms / 1e3)
        try:
            yield
        finally:
            sys.setswitchinterval(switch)
            app.state.hypic = None
            holder.pop("state", None)
            if state.core is not None:
                await run_in_threadpool(state.close)  # waits for the engine process to close the store
            else:
                state.close()
            log_event(log, "server stopped")

    app = FastAPI(
        title="hypic-agent",
        version="0.1.0",
        summary="Position-independent segment caching (HYPIC) for hybrid-attention LLMs",
        lifespan=lifespan,
    )
    app.state.hypic = None
    app.state.auth_failures = FailedKeyLimiter.from_settings(settings)

    def count_error(type_: str) -> None:
        metrics.errors.labels(type_).inc()

    install_error_handlers(app, on_error=count_error)
    for r in (generate.router, segments.router, chat.router, completions.router, system.router):
        app.include_router(r)
    app.state.inflight = InflightBytes(settings.max_inflight_body_bytes)
    app.add_middleware(
        BodyLimitMiddleware,
        max_bytes=settings.max_body_bytes,
        on_error=count_error,
        timeout_s=settings.body_timeout_s,
        inflight=app.state.inflight,
    )
    app.add_middleware(ErrorGuardMiddleware, on_error=count_error)
    app.add_middleware(AccessLogMiddleware, metrics=metrics)
    app.state.metrics = metrics
    return app
