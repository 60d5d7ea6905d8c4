"""``POST /v1/generate``: segments + query -> text, as JSON or an SSE stream."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from hypic_agent.api import service
from hypic_agent.api.deps import tenant
from hypic_agent.api.job_stream import JobStream, finish_job
from hypic_agent.api.limits import RequestLimits
from hypic_agent.api.responses import BODY, COMMON, error_responses
from hypic_agent.api.schemas import GenerateRequest, GenerateResponse
from hypic_agent.api.served import check_model
from hypic_agent.api.state import ServerState, get_state
from hypic_agent.api.streaming import sse_body
from hypic_agent.runtime.results import FinishEvent
from hypic_agent.segments.prompt.kinds import Segment

router = APIRouter(tags=["generate"])

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@router.post(
    "/v1/generate",
    response_model=GenerateResponse,
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "JSON, or SSE with stream=true"},
        **error_responses(*BODY, *COMMON, 404),
    },
)
async def generate(req: GenerateRequest, request: Request, tenant_name: str = Depends(tenant)) -> Any:
    st = get_state(request)
    check_model(st, req.model)
    RequestLimits(st.settings, st.engine.max_context).check_prompt(req.segments, [req.query])
    segments = [s.to_segment() for s in req.segments]
    job = await run_in_threadpool(prepare, st, req, segments, tenant_name)
    if not req.stream:
        fin, ttft = await finish_job(st, job, request)
        return JSONResponse(service.body_of(st, job, fin, ttft))
    return await stream_generate(st, job)


def prepare(st: ServerState, req: GenerateRequest, segments: list[Segment], tenant_name: str) -> service.GenerateJob:
    """The checked job, its new entries charged to the tenant's store budget (413 / 429 before any build)."""
    job = service.prepare_job(st, req, segments, req.query, tenant_name)
    st.admit_prompt(job.plan, job.mode, job.seam, tenant_name, job.sampling.max_tokens)
    return job


async def stream_generate(st: ServerState, job: service.GenerateJob) -> StreamingResponse:
    stream = JobStream.open(st, job)
    first = await stream.first()  # errors before the first event still get a proper status
    ttft = first.since_start_ms

    def render(t: service.Timed) -> list[dict[str, Any]]:
        ev = t.event
        if isinstance(ev, FinishEvent):
            usage = service.usage_of(job, ev.prepared, ev.completion_tokens)
            service.observe(st, job, ev, ttft, usage)
            return [
                {
                    "id": job.id,
                    "text": "",
                    "finish_reason": ev.finish_reason,
                    "usage": usage.model_dump(),
                    "timings": service.timings_of(t, ttft).model_dump(),
                }
            ]
        return [{"id": job.id, "text": ev.text, "token_id": ev.token_id, "logprob": ev.logprob}]

    return StreamingResponse(sse_body(first, stream, render), media_type="text/event-stream", headers=SSE_HEADERS)
