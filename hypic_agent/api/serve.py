"""``hypic-agent serve``: load the model (rich progress), open the store, optionally pre-warm
segments from a JSON file, then run uvicorn. Logs are JSON lines on stderr."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from hypic_agent.api.logs import configure_logging, log_event
from hypic_agent.config import Settings
from hypic_agent.errors import InvalidRequestError

log = logging.getLogger("hypic.serve")


def _progress(console: Console) -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )


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
    console = Console(stderr=True)
    with _progress(console) as progress:
        task = progress.add_task(f"loading model {settings.model}", total=2)
        engine = load_engine(settings, progress=lambda msg: progress.update(task, description=msg))
        progress.update(task, advance=1, description=f"opening store under {settings.home}")
        store = SegmentStore.from_settings(settings)
        progress.update(task, advance=1, description=f"model {engine.name} ready, {store.stats().entries} entries")
        if prewarm is not None:
            items = read_prewarm(prewarm)
            state = ServerState.build(settings, engine, store, Metrics(), owns_store=False)
            warm = progress.add_task(f"pre-warming {len(items)} segments", total=len(items))
            for item in items:
                put_segments(state, PutSegmentsRequest.model_validate({"segments": [item]}), tenant)
                progress.advance(warm)
    app = create_app(settings, engine=engine, store=store, close_store=True)  # closed by the lifespan
    log_event(log, "listening", host=settings.host, port=settings.port, url=f"http://{settings.host}:{settings.port}")
    # NOTE: uvicorn re-raises SIGTERM/SIGINT after a graceful shutdown, so nothing after run() is reached
    uvicorn.run(app, host=settings.host, port=settings.port, log_config=None, access_log=False)
