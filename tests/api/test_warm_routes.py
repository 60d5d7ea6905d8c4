"""``api.warm_routes``: before ``serve`` listens, the lifespan sends the first requests clients send
through the app itself, so the first user request pays no API-side first use (route state,
validators, SSE, the engine pipe)."""

from __future__ import annotations

import logging
from pathlib import Path

from fastapi.testclient import TestClient

from hypic_agent.api import create_app
from hypic_agent.api.warm_routes import warm_requests
from hypic_agent.config import Settings
from hypic_agent.runtime.engine import Engine

from .conftest import TINY


def _warm_record(caplog) -> logging.LogRecord | None:
    return next((r for r in caplog.records if r.getMessage().startswith("warmed the API routes")), None)


def test_serve_warms_every_route_before_serving(engine: Engine, tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="hypic.startup")
    keys, home = {"k1": "acme"}, tmp_path / "h"
    settings = Settings(home=home, device="cpu", model=TINY, warm_start=True, api_keys=keys, metrics_open=True)
    with TestClient(create_app(settings, engine=engine, warm=True)) as client:
        rec = _warm_record(caplog)
        assert rec is not None, "the lifespan sent no warm-up requests"
        assert rec.fields["statuses"] == [200] * len(warm_requests())  # type: ignore[attr-defined]
        served = client.get("/metrics").text
        # each went through the route as a user's request does: counted under the key's tenant
        assert 'route="/v1/generate"' in served and 'route="/v1/chat/completions"' in served


def test_no_warm_up_unless_asked(engine: Engine, tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="hypic.startup")
    auto = Settings(home=tmp_path / "a", device="cpu", model=TINY)  # warm_start auto: a CPU engine is not warmed
    with TestClient(create_app(auto, engine=engine, warm=True)):
        assert _warm_record(caplog) is None
    on = Settings(home=tmp_path / "b", device="cpu", model=TINY, warm_start=True)
    with TestClient(create_app(on, engine=engine)):  # embedded apps (warm=False) never send requests
        assert _warm_record(caplog) is None
