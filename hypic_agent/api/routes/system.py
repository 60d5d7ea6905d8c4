"""``GET /v1/models``, ``/health``, ``/metrics``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from hypic_agent.api.deps import tenant
from hypic_agent.api.state import get_state

router = APIRouter(tags=["system"])


@router.get("/v1/models")
async def models(request: Request, _tenant: str = Depends(tenant)) -> Any:
    st = get_state(request)
    e = st.engine
    return {
        "object": "list",
        "data": [
            {
                "id": e.name,
                "object": "model",
                "created": int(st.started_at),
                "owned_by": "hypic-agent",
                "fingerprint": e.fingerprint,
                "max_context": e.max_context,
                "modes": ["full_recompute", "prefix_cache", "addition", "transition", "transition_rope", "hypic"],
            }
        ],
    }


@router.get("/health")
async def health(request: Request) -> Any:
    st = get_state(request)
    stats = st.store.stats()
    return {
        "status": "ok",
        "model": st.engine.name,
        "fingerprint": st.engine.fingerprint,
        "store": {"entries": stats.entries, "bytes": stats.bytes_per_tier()},
        "auth": "open" if st.auth.open else "api_keys",
    }


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(get_state(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)
