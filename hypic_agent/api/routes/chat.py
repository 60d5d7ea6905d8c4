"""``POST /v1/chat/completions`` (OpenAI-compatible, incl. streaming and ``stream_options.include_usage``).

Besides OpenAI's fields, responses carry ``hypic`` with the native per-segment usage and timings;
``usage.prompt_tokens_details.cached_tokens`` is the tokens served from segment entries.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from hypic_agent.api import service
from hypic_agent.api.chat import ChatRequest, chat_to_segments
from hypic_agent.api.deps import tenant
from hypic_agent.api.routes.generate import SSE_HEADERS
from hypic_agent.api.schemas import UsageOut
from hypic_agent.api.state import ServerState, get_state
from hypic_agent.api.streaming import EventPump, sse_body
from hypic_agent.runtime.results import FinishEvent

router = APIRouter(tags=["openai"])


def chat_usage(u: UsageOut) -> dict[str, Any]:
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    }


def _prepare(st: ServerState, req: ChatRequest, tenant_name: str) -> service.GenerateJob:
    segments, query = chat_to_segments(req)
    return service.prepare_job(st, req.to_sampling(), segments, query, tenant_name)


@router.post("/v1/chat/completions")
async def chat_completions(req: ChatRequest, request: Request, tenant_name: str = Depends(tenant)) -> Any:
    st = get_state(request)
    job = await run_in_threadpool(_prepare, st, req, tenant_name)
    created = int(time.time())
    cid = f"chatcmpl-{job.id}"
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return await _stream(st, job, cid, created, include_usage)
    body = await run_in_threadpool(service.collect, st, job)
    usage = UsageOut.model_validate(body["usage"])
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": body["text"]},
        "finish_reason": body["finish_reason"],
        "logprobs": None,
    }
    if job.sampling.logprobs:
        choice["logprobs"] = {
            "content": [
                {"token": x["token"], "logprob": x["logprob"], "bytes": list(x["token"].encode()), "top_logprobs": []}
                for x in body["logprobs"]
            ]
        }
    return JSONResponse(
        {
            "id": cid,
            "object": "chat.completion",
            "created": created,
            "model": st.engine.name,
            "choices": [choice],
            "usage": chat_usage(usage),
            "hypic": {"usage": body["usage"], "timings": body["timings"]},
        }
    )


async def _stream(
    st: ServerState, job: service.GenerateJob, cid: str, created: int, include_usage: bool
) -> StreamingResponse:
    pump: EventPump[service.Timed] = EventPump(lambda: service.run_job(st, job))
    first = await pump.next()
    assert first is not None
    ttft = first.since_start_ms
    base = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": st.engine.name}

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}], **extra}

    opening = [chunk({"role": "assistant", "content": ""})]

    def render(t: service.Timed) -> list[dict[str, Any]]:
        out = [opening.pop()] if opening else []
        ev = t.event
        if not isinstance(ev, FinishEvent):
            if ev.text:
                out.append(chunk({"content": ev.text}))
            return out
        usage = service.usage_of(job, ev.prepared, ev.completion_tokens)
        service.observe(st, job, ev, ttft, usage)
        hypic = {"usage": usage.model_dump(), "timings": service.timings_of(t, ttft).model_dump()}
        out.append(chunk({}, ev.finish_reason, hypic=hypic))
        if include_usage:
            out.append({**base, "choices": [], "usage": chat_usage(usage)})
        return out

    return StreamingResponse(sse_body(first, pump, render), media_type="text/event-stream", headers=SSE_HEADERS)
