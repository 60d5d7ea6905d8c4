"""The e2e plumbing works before the real app exists: sync + async clients into a FastAPI app
(lifespan, JSON, sse-starlette streaming, error envelope) in-process."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import httpx
import pytest

fastapi = pytest.importorskip("fastapi")
sse = pytest.importorskip("sse_starlette.sse")

import hypic_client as hc  # noqa: E402
from hypic_asgi_bridge import app_sync_transport  # noqa: E402


def make_app() -> Any:
    state: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: Any):
        state["up"] = True
        yield
        state["up"] = False

    app = fastapi.FastAPI(lifespan=lifespan)

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok" if state.get("up") else "starting"}

    @app.post("/v1/generate")
    async def generate(body: dict[str, Any]) -> Any:
        if not body.get("segments"):
            err = {"error": {"type": "invalid_request", "message": "segments must not be empty", "param": "segments"}}
            return fastapi.responses.JSONResponse(err, status_code=400)
        if body.get("stream"):

            async def events():
                yield {"data": json.dumps({"id": "g", "text": "Pa", "token_id": 1, "logprob": -0.1})}
                yield {"data": json.dumps({"id": "g", "text": "ris"})}
                yield {
                    "data": json.dumps({"id": "g", "text": "", "finish_reason": "stop", "usage": {"prompt_tokens": 3}})
                }
                yield {"data": "[DONE]"}

            return sse.EventSourceResponse(events())
        return {"id": "g", "text": "Paris", "finish_reason": "stop", "usage": {"prompt_tokens": 3}}

    return app


def test_sync_client_through_portal_transport():
    app = make_app()
    with app_sync_transport(app) as transport, hc.Hypic("http://app", transport=transport, max_retries=0) as c:
        assert c.health().status == "ok"  # lifespan ran
        assert c.generate(["d"], "q").text == "Paris"
        final = c.generate(["d"], "q", stream=True).final_response()
        assert final.text == "Paris" and final.usage.prompt_tokens == 3
        with pytest.raises(hc.BadRequestError) as ei:
            c.generate([], "q")
        assert ei.value.param == "segments"


def test_async_client_through_asgi_transport(app_lifespan: Any):
    app = make_app()

    async def go():
        async with app_lifespan(app):
            transport = httpx.ASGITransport(app=app)
            async with hc.AsyncHypic("http://app", transport=transport, max_retries=0) as c:
                stream = await c.generate(["d"], "q", stream=True)
                return await c.health(), [ch.text async for ch in stream]

    health, texts = asyncio.run(go())
    assert health.status == "ok" and texts == ["Pa", "ris", ""]
