"""``POST /v1/chat/completions`` (OpenAI-compatible, incl. streaming and ``stream_options.include_usage``).

Besides OpenAI's fields, responses carry ``hypic`` with the native per-segment usage and timings;
``usage.prompt_tokens_details.cached_tokens`` is the tokens served from segment entries. Tool
calls, ``response_format`` and ``top_logprobs``: ``api/chat_job.py`` (request side) and
``api/chat_output.py`` (response side).
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from hypic_agent.api import service
from hypic_agent.api.chat import ChatRequest, message_texts
from hypic_agent.api.chat_job import ChatJob, prepare_chat
from hypic_agent.api.chat_output import ChatOutput, logprob_entry, logprobs_content
from hypic_agent.api.deps import tenant
from hypic_agent.api.job_stream import JobStream, finish_job
from hypic_agent.api.limits import RequestLimits
from hypic_agent.api.responses import BODY, COMMON, error_responses
from hypic_agent.api.routes.generate import SSE_HEADERS
from hypic_agent.api.schemas import UsageOut
from hypic_agent.api.state import ServerState, get_state
from hypic_agent.api.streaming import sse_body
from hypic_agent.runtime.results import FinishEvent

router = APIRouter(tags=["openai"])


def chat_usage(u: UsageOut) -> dict[str, Any]:
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    }


@router.post(
    "/v1/chat/completions",
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "JSON, or SSE with stream=true"},
        **error_responses(*BODY, *COMMON, 404),
    },
)
async def chat_completions(req: ChatRequest, request: Request, tenant_name: str = Depends(tenant)) -> Any:
    st = get_state(request)
    limits = RequestLimits(st.settings, st.engine.max_context)
    limits.check_prompt(req.segments or [], message_texts(req))
    for i, tool in enumerate(req.tools or []):
        limits.check_schema(tool.function.parameters, f"tools.{i}.function.parameters")
    if req.response_format is not None and req.response_format.json_schema is not None:
        limits.check_schema(req.response_format.json_schema.schema_, "response_format.json_schema.schema")
    cj = await run_in_threadpool(prepare_chat, st, req, tenant_name)
    created = int(time.time())
    cid = f"chatcmpl-{cj.job.id}"
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return await _stream(st, cj, cid, created, include_usage)
    job = cj.job
    fin, ttft = await finish_job(st, job, request)
    ev = fin.event
    assert isinstance(ev, FinishEvent)
    usage = service.usage_of(job, ev.prepared, ev.completion_tokens)
    service.observe(st, job, ev, ttft, usage)
    out = ChatOutput(cj)
    choice: dict[str, Any] = {
        "index": 0,
        "message": out.message(ev.text),
        "finish_reason": out.finish_reason(ev.finish_reason),
        "logprobs": None,
    }
    if job.sampling.logprobs:
        choice["logprobs"] = logprobs_content(st.engine.tokenizer, ev.token_ids, ev.logprobs, ev.top_logprobs)
    return JSONResponse(
        {
            "id": cid,
            "object": "chat.completion",
            "created": created,
            "model": st.engine.name,
            "choices": [choice],
            "usage": chat_usage(usage),
            "hypic": {"usage": usage.model_dump(), "timings": service.timings_of(fin, ttft).model_dump()},
        }
    )


async def _stream(st: ServerState, cj: ChatJob, cid: str, created: int, include_usage: bool) -> StreamingResponse:
    job = cj.job
    stream = JobStream.open(st, job)
    first = await stream.first()
    ttft = first.since_start_ms
    base = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": st.engine.name}
    out = ChatOutput(cj)
    tok = st.engine.tokenizer

    def chunk(delta: dict[str, Any], finish: str | None = None, logprobs: Any = None, **extra: Any) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
        return {**base, "choices": [choice], **extra}

    opening = [chunk({"role": "assistant", "content": ""})]

    def render(t: service.Timed) -> list[dict[str, Any]]:
        res = [opening.pop()] if opening else []
        ev = t.event
        if not isinstance(ev, FinishEvent):
            deltas = out.feed(ev.text)
            lp = None
            if ev.token_id is not None and ev.logprob is not None:  # logprobs requested
                lp = {"content": [logprob_entry(tok, ev.token_id, ev.logprob, ev.top_logprobs)]}
                if not deltas:
                    deltas = [{}]
            res.extend(chunk(d, logprobs=lp if i == 0 else None) for i, d in enumerate(deltas))
            return res
        res.extend(chunk(d) for d in out.finish())
        usage = service.usage_of(job, ev.prepared, ev.completion_tokens)
        service.observe(st, job, ev, ttft, usage)
        hypic = {"usage": usage.model_dump(), "timings": service.timings_of(t, ttft).model_dump()}
        res.append(chunk({}, out.finish_reason(ev.finish_reason), hypic=hypic))
        if include_usage:
            res.append({**base, "choices": [], "usage": chat_usage(usage)})
        return res

    return StreamingResponse(sse_body(first, stream, render), media_type="text/event-stream", headers=SSE_HEADERS)
