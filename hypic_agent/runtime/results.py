"""What the engine hands back: per-segment usage, timings, streamed events."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypic_agent.runtime.state import RequestState


@dataclass
class SegmentUsage:
    id: str | None  # content key (None: not cacheable, e.g. BOS or too short)
    kind: str
    tokens: int
    hit: bool
    tier: str | None


@dataclass
class Prepared:
    """A prompt turned into a ``RequestState``, with how it was built."""

    state: RequestState | None  # None once the scheduler moved it into the state pool
    mode: str
    segments: list[SegmentUsage]
    prompt_tokens: int
    cached_tokens: int  # served from entries that existed before this request (or exact prefix reuse)
    recomputed_tokens: int  # computed for this request: active tokens + cold segment prefill
    exact_prefix_tokens: int = 0  # prefix_cache only: tokens reused as an exact prefix
    timings_ms: dict[str, float] = field(default_factory=dict)


@dataclass
class TokenEvent:
    text: str
    token_id: int | None  # None: text released at the end (held back for stop strings), no new token
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None  # (token id, logprob), most likely first


@dataclass
class FinishEvent:
    text: str
    finish_reason: str  # "stop" | "length"
    completion_tokens: int
    prepared: Prepared
    ttft_ms: float
    total_ms: float
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
