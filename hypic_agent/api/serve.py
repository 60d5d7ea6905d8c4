"""``hypic-agent serve``: load the model, open the store, optionally pre-warm segments from a JSON
file, then run uvicorn. Logs are JSON lines on stderr; start-up says what it is doing (fetching,
reading weights, building, pre-warming) with a line every few seconds (``startup.StartupLog``)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from hypic_agent.api.logs import configure_logging, log_event
from hypic_agent.config import Settings
from hypic_agent.errors import InvalidRequestError
from hypic_agent.startup import StartupLog

log = logging.getLogger("hypic.serve")


def read_prewarm(path: Path) -> list[dict[str, Any]]:
    """A JSON list of wire segments, or ``{"segments": [...]}``."""
    data = json.loads(path.read_text())
    items = data.get("segments") if isinstance(data, dict) else data
    if not isinstance(items, list) or not all(isinstance(x, dict) for x in items):
        raise InvalidRequestError(f"{path}: expected a JSON list of segments or {{'segments': [...]}}", param="prewarm")
    return items


def run_server(settings: Settings, *, prewarm: Path | None = None, tenant: str = "default") -> None:
    import uvicorn

    from hypic_agent.api.app import create_app
    from hypic_agent.api.metrics import Metrics
    from hypic_agent.api.schemas import PutSegmentsRequest
    from hypic_agent.api.segments_service import put_segments
    from hypic_agent.api.state import ServerState
    from hypic_agent.runtime.loader import load_engine
    from hypic_agent.segments.store import SegmentStore

    configure_logging(settings.log_level)
    items = read_prewarm(prewarm) if prewarm is not None else None  # a bad file fails before loading
    with StartupLog() as progress:
        progress(f"starting: model {settings.model}, home {settings.home}")
        engine = load_engine(settings, progress=progress)
        progress(f"opening the segment store under {settings.resolved_store_dir()}")
        store = SegmentStore.from_settings(settings)
        if items is not None:
            state = ServerState.build(settings, engine, store, Metrics(), owns_store=False)
            for i, item in enumerate(items):
                progress(f"pre-warming {len(items)} segments", done=i, total=len(items), unit="segments")
                put_segments(state, PutSegmentsRequest.model_validate({"segments": [item]}), tenant)
            progress(f"pre-warming {len(items)} segments", done=len(items), total=len(items), unit="segments")
        progress.done(f"model {engine.name} ready, {store.stats().entries} stored entries")
    app = create_app(settings, engine=engine, store=store, close_store=True)  # closed by the lifespan
    log_event(log, "listening", host=settings.host, port=settings.port, url=f"http://{settings.host}:{settings.port}")
    # NOTE: uvicorn re-raises SIGTERM/SIGINT after a graceful shutdown, so nothing after run() is reached
    uvicorn.run(app, host=settings.host, port=settings.port, log_config=None, access_log=False)
