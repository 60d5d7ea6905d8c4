"""``GET /v1/models``, ``GET /v1/models/{id}``, ``/health``, ``/metrics``.

With API keys on, ``/health`` without a key says only ``{"status": "ok"}`` (liveness); with a
valid key it adds the model, store and auth details. ``/metrics`` is behind ``metrics_access``
(with API keys on: the metrics token, or ``Settings.metrics_open``).
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel

from hypic_agent.api.auth import presented_key
from hypic_agent.api.deps import authenticate, metrics_access, tenant
from hypic_agent.api.responses import COMMON, error_responses
from hypic_agent.api.served import check_model, model_card, served_names
from hypic_agent.api.state import get_state

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
    if not st.auth.open and presented_key(request) is None:
        return {"status": "ok"}  # liveness only: no key, no details
    authenticate(request, st)
    stats = st.store.stats()
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
    return Response(get_state(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)
