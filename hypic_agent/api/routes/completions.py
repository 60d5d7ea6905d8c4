"""``POST /v1/completions``: OpenAI's legacy text completion, for clients that still use it.

The prompt is raw text (no chat template, no generation prompt): a ``text`` segment after the
extension ``segments``, if any, so a long prompt sent again is served from the cache like any
segment. A prompt of whitespace only is the uncached suffix, and an empty prompt (OpenAI allows
one) adds nothing: alone, the prompt is the tokenizer's BOS token (400 for a tokenizer without
one, which has nothing to start from). Types are strict, as on the other routes (``"stream":
"yes"``, ``"n": "2"`` are 422 naming the field). ``logprobs`` is OpenAI's legacy integer (that
many top alternatives per token, 0-5); ``echo``, ``suffix``, ``best_of`` > 1 and ``n`` > 1 are
refused (400). Streaming sends ``text_completion`` chunks and ``data: [DONE]``;
``stream_options.include_usage`` adds a usage chunk.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from hypic_agent.api import service
from hypic_agent.api.chat import StreamOptions
from hypic_agent.api.chat_job import check_top_logprobs, with_output_controls
from hypic_agent.api.deps import tenant
from hypic_agent.api.job_stream import JobStream
from hypic_agent.api.limits import RequestLimits
from hypic_agent.api.responses import BODY, COMMON, error_responses
from hypic_agent.api.routes.chat import chat_usage
from hypic_agent.api.routes.generate import SSE_HEADERS
from hypic_agent.api.schemas import SamplingIn
from hypic_agent.api.served import check_model
from hypic_agent.api.state import ServerState, get_state
from hypic_agent.api.streaming import sse_body
from hypic_agent.errors import InvalidRequestError
from hypic_agent.runtime.results import FinishEvent
from hypic_agent.segments.prompt.kinds import Segment, SegmentIn
from hypic_agent.segments.prompt.plan import PromptPlan
from hypic_agent.segments.prompt.tokenize import detect_bos, encode
from hypic_agent.wire import MaxTokens, Seam, Seed, Temperature, Text, TopK, TopP

router = APIRouter(tags=["openai"])


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)  # "stream": "yes", "n": "2" are type errors

    model: Text | None = None
    prompt: Text | list[Text] = Field(description="raw text (a list of one string is accepted)")
    max_tokens: MaxTokens | None = 16
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    stop: Text | list[Text] | None = None
    seed: Seed | None = None
    logprobs: int | None = Field(default=None, ge=0, le=5, description="top alternatives per token")
    echo: bool = False
    suffix: Text | None = None
    n: int = 1
    best_of: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    mode: Text | None = None
    seam: Seam | None = None
    segments: list[SegmentIn] | None = None

    def text(self) -> str:
        if isinstance(self.prompt, str):
            return self.prompt
        if len(self.prompt) != 1:
            raise InvalidRequestError("send one prompt per request (a list of exactly one string)", param="prompt")
        return self.prompt[0]

    def check(self) -> None:
        for name, bad in (("echo", self.echo), ("suffix", self.suffix), ("n", self.n != 1)):
            if bad:
                raise InvalidRequestError(f"{name} is not supported here", param=name)
        if self.best_of not in (None, 1):
            raise InvalidRequestError("best_of is not supported here", param="best_of")
        self.text()

    def sampling(self) -> SamplingIn:
        return SamplingIn(
            max_tokens=16 if self.max_tokens is None else self.max_tokens,
            temperature=0.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k or 0,
            stop=self.stop,
            seed=self.seed,
            logprobs=self.logprobs is not None,
            mode=self.mode,
            seam=self.seam,
        )


def completion_plan(st: ServerState, req: CompletionRequest, tenant_name: str, key_seam: float) -> PromptPlan:
    """The extension segments, then the prompt: a ``text`` segment (cached like any segment), or, for
    a prompt of whitespace only, the uncached suffix (no segment holds blank text). With nothing at
    all to run (an empty prompt, no segments) the prompt is the BOS token alone."""
    tok = st.engine.tokenizer
    text = req.text()
    segments = [s.to_segment() for s in req.segments or []]
    tail: tuple[int, ...] = ()
    if text.strip():
        segments.append(Segment(kind="text", text=text))
    elif text:
        tail = encode(tok, text)
    if segments:
        return replace(service.build_request_plan(st, segments, None, tenant_name, key_seam), suffix_ids=tail)
    if tail:
        return PromptPlan(segments=(), suffix_ids=tail, bos_id=detect_bos(tok))
    bos = getattr(tok, "bos_token_id", None)
    if bos is None:
        raise InvalidRequestError(
            "the prompt is empty and this model's tokenizer has no BOS token to start from, so there is "
            "nothing to continue: send some prompt text (or segments)",
            param="prompt",
        )
    return PromptPlan(segments=(), suffix_ids=(int(bos),))  # the BOS token alone


def prepare(st: ServerState, req: CompletionRequest, tenant_name: str) -> service.GenerateJob:
    check_model(st, req.model)
    req.check()
    t0 = time.perf_counter()
    mode, seam, key_seam = service.resolve_mode(st, req.mode, req.seam)
    top = check_top_logprobs(req.logprobs, req.logprobs is not None)
    sampling = with_output_controls(st, service.sampling_of(st, req.sampling()), None, top)
    plan = completion_plan(st, req, tenant_name, key_seam)
    plan.check_fits(st.engine.max_context, sampling.max_tokens)
    st.admit_prompt(plan, mode, seam, tenant_name, sampling.max_tokens)  # 413 / 429 before any build
    return service.GenerateJob(uuid.uuid4().hex, tenant_name, plan, sampling, mode, seam, key_seam, t0)


def legacy_logprobs(tok: Any, ids: list[int], lps: list[float], tops: list[list[tuple[int, float]]]) -> dict:
    tokens = [tok.decode([t]) for t in ids]
    offsets, pos = [], 0
    for t in tokens:
        offsets.append(pos)
        pos += len(t)
    return {
        "tokens": tokens,
        "token_logprobs": lps,
        "top_logprobs": [{tok.decode([t]): lp for t, lp in top} for top in tops] or None,
        "text_offset": offsets,
    }


@router.post(
    "/v1/completions",
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "JSON, or SSE with stream=true"},
        **error_responses(*BODY, *COMMON, 404),
    },
)
async def completions(req: CompletionRequest, request: Request, tenant_name: str = Depends(tenant)) -> Any:
    st = get_state(request)
    prompts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
    RequestLimits(st.settings, st.engine.max_context).check_prompt(req.segments or [], prompts)
    job = await run_in_threadpool(prepare, st, req, tenant_name)
    base = {"id": f"cmpl-{job.id}", "object": "text_completion", "created": int(time.time()), "model": st.engine.name}
    stream = JobStream.open(st, job)
    first = await stream.first()
    ttft = first.since_start_ms
    tok = st.engine.tokenizer

    def finish(t: service.Timed) -> tuple[FinishEvent, Any]:
        ev = t.event
        assert isinstance(ev, FinishEvent)
        usage = service.usage_of(job, ev.prepared, ev.completion_tokens)
        service.observe(st, job, ev, ttft, usage)
        return ev, usage

    if not req.stream:
        t: service.Timed | None = first
        try:
            while t is not None and not isinstance(t.event, FinishEvent):
                t = await stream.next()
        finally:
            stream.cancel()
        assert t is not None
        ev, usage = finish(t)
        lp = legacy_logprobs(tok, ev.token_ids, ev.logprobs, ev.top_logprobs) if job.sampling.logprobs else None
        choice = {"text": ev.text, "index": 0, "logprobs": lp, "finish_reason": ev.finish_reason}
        return JSONResponse({**base, "choices": [choice], "usage": chat_usage(usage)})

    def render(t: service.Timed) -> list[dict[str, Any]]:
        ev = t.event
        if not isinstance(ev, FinishEvent):
            lp = None
            if ev.token_id is not None and ev.logprob is not None:
                lp = legacy_logprobs(tok, [ev.token_id], [ev.logprob], [ev.top_logprobs or []])
            return [{**base, "choices": [{"text": ev.text, "index": 0, "logprobs": lp, "finish_reason": None}]}]
        ev, usage = finish(t)
        out = [{**base, "choices": [{"text": "", "index": 0, "logprobs": None, "finish_reason": ev.finish_reason}]}]
        if req.stream_options and req.stream_options.include_usage:
            out.append({**base, "choices": [], "usage": chat_usage(usage)})
        return out

    return StreamingResponse(sse_body(first, stream, render), media_type="text/event-stream", headers=SSE_HEADERS)
