"""Generation service: wire request -> validated ``GenerateJob`` -> engine events -> wire usage.

Everything a request can get wrong is checked in ``prepare_job`` *before* the engine or the
store is touched (mode, seam, sampling, segment count, stored ids, context window), so a bad
request never changes what is stored. Blocking: call from a worker thread.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from hypic_agent.api.errors import TooManySegmentsError
from hypic_agent.api.schemas import SamplingIn, SegmentUsageOut, TimingsOut, UsageOut
from hypic_agent.api.state import ServerState
from hypic_agent.errors import InvalidRequestError
from hypic_agent.runtime.hypic.modes import mode_spec, validate_seam
from hypic_agent.runtime.hypic.store_cache import EntryHint
from hypic_agent.runtime.results import FinishEvent, Prepared, TokenEvent
from hypic_agent.runtime.sampling import SamplingParams
from hypic_agent.runtime.scheduler.request import EventSink, GenerationRequest, RequestHandle
from hypic_agent.segments.prompt.keys import KeyContext
from hypic_agent.segments.prompt.kinds import Segment
from hypic_agent.segments.prompt.plan import PromptPlan, build_plan
from hypic_agent.segments.prompt.resolve import stored_resolver


@dataclass
class GenerateJob:
    id: str
    tenant: str
    plan: PromptPlan
    sampling: SamplingParams
    mode: str
    seam: float | str
    key_seam: float  # the seam that goes into entry keys for this mode (0 where seams are off)
    t0: float


def resolve_mode(st: ServerState, mode: str | None, seam: float | str | None) -> tuple[str, float | str, float]:
    """``(mode name, seam, key seam)``; raises ``UnknownModeError`` / ``InvalidRequestError``. With
    ``seam="auto"`` or ``"blend"`` the key seam is 0 (segment ids by content; the engine keys each entry by the
    width it chose)."""
    spec = mode_spec(mode or st.settings.default_mode)
    w = validate_seam(st.settings.default_seam if seam is None else seam)
    return spec.name, w, (float(w) if spec.composed and spec.seams and w not in ("auto", "blend") else 0.0)


def sampling_of(st: ServerState, req: SamplingIn) -> SamplingParams:
    if req.max_tokens > st.settings.max_tokens_limit:
        raise InvalidRequestError(
            f"max_tokens is {req.max_tokens}; this server allows at most {st.settings.max_tokens_limit}",
            param="max_tokens",
        )
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    return SamplingParams(
        max_tokens=req.max_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        stop=stop,
        seed=req.seed,
        logprobs=req.logprobs,
    ).validate()


def key_context(st: ServerState, tenant: str, key_seam: float) -> KeyContext:
    return KeyContext(st.engine.fingerprint, tenant, key_seam)


def build_request_plan(
    st: ServerState, segments: Sequence[Segment], query: str | None, tenant: str, key_seam: float
) -> PromptPlan:
    if len(segments) > st.settings.max_segments:
        raise TooManySegmentsError(
            f"{len(segments)} segments in one request; the limit is {st.settings.max_segments}: "
            "merge small segments or raise HYPIC_MAX_SEGMENTS",
            param="segments",
        )
    ctx = key_context(st, tenant, key_seam)
    resolve = stored_resolver(st.store.info, ctx)
    return build_plan(segments, query, st.engine.tokenizer, ctx, framer=st.framer, resolve=resolve)


def prepare_job(
    st: ServerState, req: SamplingIn, segments: Sequence[Segment], query: str | None, tenant: str
) -> GenerateJob:
    t0 = time.perf_counter()
    mode, seam, key_seam = resolve_mode(st, req.mode, req.seam)
    sampling = sampling_of(st, req)
    plan = build_request_plan(st, segments, query, tenant, key_seam)
    plan.check_fits(st.engine.max_context, sampling.max_tokens)
    return GenerateJob(uuid.uuid4().hex, tenant, plan, sampling, mode, seam, key_seam, t0)


def hints_of(job: GenerateJob) -> dict[str, EntryHint]:
    """Registry facts (text, title, policy) of the plan's segments, keyed like the engine keys them."""
    out: dict[str, EntryHint] = {}
    for s in job.plan.segments:
        out[s.key] = EntryHint(
            text=s.text, title=s.title, pinned=s.cache.pin, ttl_s=s.cache.ttl, extra=dict(s.metadata)
        )
    return out


@dataclass
class Timed:
    """An engine event with the worker-side clock: ms since the request arrived, queue wait."""

    event: TokenEvent | FinishEvent
    since_start_ms: float
    queue_ms: float


def submit_job(
    st: ServerState, job: GenerateJob, sink: EventSink | None = None, hints: dict[str, EntryHint] | None = None
) -> RequestHandle:
    """Queue ``job`` on the engine's scheduler (raises 4xx / 429 before anything runs; in the engine
    process a full queue is its first item instead); with ``sink`` its events go there
    (``api.job_stream``) instead of ``handle.events()``. ``hints``: ``hints_of(job)``, held by the
    caller in-process (``ServerState.describe``), sent along to the engine process."""
    req = GenerationRequest(job.plan, job.sampling, job.mode, job.seam, job.tenant, t0=job.t0)
    return st.submit(req, sink, hints if hints is not None else hints_of(job))


def run_job(st: ServerState, job: GenerateJob) -> Iterator[Timed]:
    """Engine events of ``job`` as the scheduler streams them, on the caller's thread (blocking; the
    routes use ``api.job_stream`` instead); closing the iterator cancels it."""
    hints = hints_of(job)
    with st.describe(hints):
        handle = submit_job(st, job, hints=hints)
        events = handle.events()  # a generator: closing it cancels the request
        try:
            for ev in events:
                yield Timed(ev, (time.perf_counter() - job.t0) * 1e3, handle.queue_ms)
        finally:
            events.close()  # type: ignore[attr-defined]
            handle.cancel()  # no-op after the finish event


# --------------------------------------------------------------------------- wire output


def usage_of(job: GenerateJob, prepared: Prepared, completion_tokens: int) -> UsageOut:
    """Per-segment usage in the request's own order (the engine's BOS piece is not reported;
    a last segment that the engine ran as the suffix, for want of a query, is reported uncached)."""
    engine_segs = list(prepared.segments)
    if job.plan.bos_id is not None and engine_segs and engine_segs[0].kind == "bos":
        engine_segs = engine_segs[1:]
    out: list[SegmentUsageOut] = []
    for i, cs in enumerate(job.plan.segments):
        u = engine_segs[i] if i < len(engine_segs) else None
        hit = u is not None and u.hit
        out.append(
            SegmentUsageOut(
                id=cs.ref or cs.key,
                kind=cs.kind,
                tokens=cs.n_tokens,
                hit=hit,
                tier=u.tier if u is not None and hit else None,
            )
        )
    return UsageOut(
        prompt_tokens=prepared.prompt_tokens,
        completion_tokens=completion_tokens,
        cached_tokens=prepared.cached_tokens,
        recomputed_tokens=prepared.recomputed_tokens,
        exact_prefix_tokens=prepared.exact_prefix_tokens,
        mode=prepared.mode,
        segments=out,
    )


def timings_of(fin: Timed, ttft_ms: float) -> TimingsOut:
    ev = fin.event
    assert isinstance(ev, FinishEvent)
    engine = {k: round(v, 3) for k, v in ev.prepared.timings_ms.items()}
    engine["ttft_ms"] = round(ev.ttft_ms, 3)
    return TimingsOut(
        ttft_ms=round(ttft_ms, 3), total_ms=round(fin.since_start_ms, 3), queue_ms=round(fin.queue_ms, 3), engine=engine
    )


def observe(st: ServerState, job: GenerateJob, fin: FinishEvent, ttft_ms: float, usage: UsageOut) -> None:
    m = st.metrics
    m.ttft.labels(job.mode).observe(ttft_ms / 1e3)
    m.observe_usage(job.mode, usage.segments, usage.cached_tokens, usage.recomputed_tokens, fin.completion_tokens)


def logprobs_of(st: ServerState, fin: FinishEvent) -> list[dict[str, Any]]:
    tok = st.engine.tokenizer
    return [
        {"token": tok.decode([t]), "token_id": t, "logprob": lp}
        for t, lp in zip(fin.token_ids, fin.logprobs, strict=False)
    ]


def body_of(st: ServerState, job: GenerateJob, fin: Timed, ttft: float) -> dict[str, Any]:
    """The non-streaming ``/v1/generate`` body (and its metrics)."""
    ev = fin.event
    assert isinstance(ev, FinishEvent)
    usage = usage_of(job, ev.prepared, ev.completion_tokens)
    observe(st, job, ev, ttft, usage)
    body: dict[str, Any] = {
        "id": job.id,
        "object": "generation",
        "model": st.engine.name,
        "text": ev.text,
        "finish_reason": ev.finish_reason,
        "usage": usage.model_dump(),
        "timings": timings_of(fin, ttft).model_dump(),
    }
    if job.sampling.logprobs:
        body["logprobs"] = logprobs_of(st, ev)
    return body
