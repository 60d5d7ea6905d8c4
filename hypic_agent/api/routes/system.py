"""``GET /v1/models``, ``GET /v1/models/{id}``, ``/health``, ``/metrics``.

With API keys on, ``/health`` without a key says only ``{"status": "ok"}`` (liveness); with a
valid key it adds the model, store and auth details. Once the engine process died
(``Settings.engine_process``) ``/health`` answers 503 ``{"status": "engine_dead", "engine": {pid,
exitcode}, "error": {...}}`` (without a key while keys are on: only the status and a bare error).
``/metrics`` is behind ``metrics_access`` (with API keys on: the metrics token, or
``Settings.metrics_open``).
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from hypic_agent.api.auth import presented_key
from hypic_agent.api.deps import authenticate, metrics_access, tenant
from hypic_agent.api.errors import envelope
from hypic_agent.api.responses import COMMON, error_responses
from hypic_agent.api.served import check_model, model_card, served_names
from hypic_agent.api.state import ServerState, get_state

router = APIRouter(tags=["system"])


class HealthOut(BaseModel):
    status: Literal["ok"] = "ok"
    model: str | None = None
    fingerprint: str | None = None
    store: dict[str, Any] | None = None
    auth: str | None = None


@router.get("/v1/models", responses=error_responses(*COMMON))
async def models(request: Request, _tenant: str = Depends(tenant)) -> Any:
    st = get_state(request)
    return {"object": "list", "data": [model_card(st, name) for name in served_names(st)]}


@router.get("/v1/models/{model_id:path}", responses=error_responses(404, 422, *COMMON))
async def model(model_id: str, request: Request, _tenant: str = Depends(tenant)) -> Any:
    """One served model (the engine's name or an alias); 404 ``model_not_found`` otherwise."""
    st = get_state(request)
    check_model(st, model_id)
    return model_card(st, model_id)


@router.get(
    "/health", response_model=HealthOut, response_model_exclude_none=True, responses=error_responses(401, 429, 500, 503)
)
async def health(request: Request) -> Any:
    st = get_state(request)
    liveness = not st.auth.open and presented_key(request) is None
    if not liveness:
        authenticate(request, st)
    dead = engine_dead(st, details=not liveness)
    if dead is not None:
        return dead
    if liveness:
        return {"status": "ok"}  # liveness only: no key, no details
    stats = await run_in_threadpool(st.store.stats) if st.core is not None else st.store.stats()
    return {
        "status": "ok",
        "model": st.engine.name,
        "fingerprint": st.engine.fingerprint,
        "store": {"entries": stats.entries, "bytes": stats.bytes_per_tier()},
        "auth": "open" if st.auth.open else "api_keys",
    }


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    dependencies=[Depends(metrics_access)],
    responses=error_responses(401, 429, 500, 503),
)
async def metrics(request: Request) -> Response:
    st = get_state(request)
    body = await run_in_threadpool(st.metrics.render) if st.core is not None else st.metrics.render()
    return Response(body, media_type=CONTENT_TYPE_LATEST)


def engine_dead(st: ServerState, details: bool = True) -> JSONResponse | None:
    """The 503 ``/health`` answers once the engine process is gone (None while it serves, or in-process);
    without ``details`` (API keys on, no key given) it does not say which process or how."""
    if st.core is None:
        return None
    status = st.core.status()
    if status.message is None:
        return None
    if not details:
        body = {"status": "engine_dead", **envelope("engine_dead", "the engine process is gone; see the server log")}
        return JSONResponse(body, status_code=503)
    body = {
        "status": "engine_dead",
        "engine": {"pid": status.pid, "exitcode": status.exitcode},
        **envelope("engine_dead", status.message),
    }
    return JSONResponse(body, status_code=503)
