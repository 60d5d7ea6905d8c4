"""``/v1/segments``: register + pre-warm (PUT), list, inspect, pin / TTL (PATCH), delete."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from starlette.concurrency import run_in_threadpool

from hypic_agent.api import segments_service as svc
from hypic_agent.api.deps import tenant
from hypic_agent.api.responses import BODY, COMMON, error_responses
from hypic_agent.api.schemas import PatchSegmentRequest, PutSegmentsRequest, SegmentDeleted, SegmentInfo, SegmentList
from hypic_agent.api.state import get_state

router = APIRouter(tags=["segments"])


@router.put("/v1/segments", response_model=SegmentList, responses=error_responses(*BODY, *COMMON, 404, 409))
async def put_segments(req: PutSegmentsRequest, request: Request, tenant_name: str = Depends(tenant)) -> Any:
    return await run_in_threadpool(svc.put_segments, get_state(request), req, tenant_name)


@router.get("/v1/segments", response_model=SegmentList, responses=error_responses(400, 422, *COMMON))
async def list_segments(
    request: Request,
    limit: int = Query(50, ge=1, le=1000),
    after: str | None = Query(
        None, description="the 'next' cursor of the previous page", json_schema_extra={"pattern": "^[0-9]{1,19}$"}
    ),
    kind: str | None = Query(None),
    tenant_name: str = Depends(tenant),
) -> Any:
    return await run_in_threadpool(svc.list_segments, get_state(request), tenant_name, limit, after, kind)


@router.get("/v1/segments/{segment_id}", response_model=SegmentInfo, responses=error_responses(404, 422, *COMMON))
async def get_segment(segment_id: str, request: Request, tenant_name: str = Depends(tenant)) -> Any:
    return await run_in_threadpool(svc.get_segment, get_state(request), segment_id, tenant_name)


@router.patch(
    "/v1/segments/{segment_id}", response_model=SegmentInfo, responses=error_responses(*BODY, *COMMON, 404, 409)
)
async def patch_segment(
    segment_id: str, req: PatchSegmentRequest, request: Request, tenant_name: str = Depends(tenant)
) -> Any:
    return await run_in_threadpool(svc.patch_segment, get_state(request), segment_id, req, tenant_name)


@router.delete("/v1/segments/{segment_id}", response_model=SegmentDeleted, responses=error_responses(404, 422, *COMMON))
async def delete_segment(segment_id: str, request: Request, tenant_name: str = Depends(tenant)) -> Any:
    return await run_in_threadpool(svc.delete_segment, get_state(request), segment_id, tenant_name)
