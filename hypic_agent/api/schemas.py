"""Wire schemas of the native routes (``/v1/generate``, ``/v1/segments``) and the error envelope.

Requests check types and shapes here (violations: 422) and every value's range with the
``hypic_agent.wire`` types (finite numbers, sampling ranges, text without lone surrogates or
NUL: violations 400 with a ``param``); modes, segment counts and context limits are checked by
the service (400). Types are strict (``strict=True``, inherited by ``ChatRequest``): a number is
a JSON number and a flag a JSON boolean, never a string that looks like one (``"4"``, ``"yes"``).
Responses keep the names of ``/work/shared/DESIGN.md`` and what ``hypic_client`` parses.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from hypic_agent.config import MODES
from hypic_agent.segments.prompt.kinds import SegmentIn
from hypic_agent.wire import MaxTokens, Seam, Seed, Temperature, Text, TopK, TopP, invalid

MAX_STOP = 16
MAX_STOP_CHARS = 1000

# --------------------------------------------------------------------------- requests


class SamplingIn(BaseModel):
    """Sampling fields shared by generate and chat (ranges checked by ``SamplingParams.validate``)."""

    model_config = ConfigDict(strict=True)

    max_tokens: MaxTokens = Field(default=64, description="completion tokens at most (>= 1)")
    temperature: Temperature = Field(default=0.0, description="0 = greedy, else in [0.001, 5]")
    top_p: TopP = 1.0
    top_k: TopK = 0
    stop: Text | list[Text] | None = Field(default=None, description=f"up to {MAX_STOP} non-empty strings")
    seed: Seed | None = None
    logprobs: bool = False
    mode: Text | None = Field(
        default=None,
        description="full_recompute | prefix_cache | ... | hypic",
        json_schema_extra={"enum": [*MODES, None]},
    )
    seam: Seam | None = Field(
        default=None,
        description='seam width: 0 none, (0,1] fraction, > 1 tokens, "auto" (per segment, under seam_budget) '
        'or "blend" (seams and scattered body tokens, under seam_budget)',
    )

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > MAX_STOP:
            raise invalid("at most {n} stop strings, got {got}", n=MAX_STOP, got=len(stops))
        if any(not s or len(s) > MAX_STOP_CHARS for s in stops):
            raise invalid("stop strings must be non-empty and at most {n} characters", n=MAX_STOP_CHARS)
        return value


class GenerateRequest(SamplingIn):
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={"anyOf": [{"required": ["segments"]}, {"required": ["query"]}]},
    )

    segments: list[SegmentIn] = Field(default_factory=list)
    query: Text | None = None
    stream: bool = False
    model: Text | None = None


class PutSegmentsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    segments: list[SegmentIn] = Field(json_schema_extra={"minItems": 1})
    mode: Text | None = Field(
        default=None,
        description="the mode whose entries to pre-warm (default: server's)",
        json_schema_extra={"enum": [*MODES, None]},
    )
    seam: Seam | None = None


class CacheUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"minProperties": 1})

    pin: bool | None = None
    ttl: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, description="seconds after last use (finite); null clears it"
    )


class PatchSegmentRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    cache: CacheUpdate


# --------------------------------------------------------------------------- responses


class SegmentUsageOut(BaseModel):
    id: str | None
    kind: str
    tokens: int
    hit: bool
    tier: str | None


class UsageOut(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    recomputed_tokens: int
    exact_prefix_tokens: int = Field(description="tokens reused as an exact prefix (prefix_cache mode only)")
    mode: str
    segments: list[SegmentUsageOut]


class TimingsOut(BaseModel):
    ttft_ms: float
    total_ms: float
    queue_ms: float = 0.0
    engine: dict[str, float] = Field(default_factory=dict, description="lookup/scatter/combine/prefill ms")


class TokenLogprobOut(BaseModel):
    token: str
    token_id: int
    logprob: float


class GenerateResponse(BaseModel):
    id: str
    object: Literal["generation"] = "generation"
    model: str
    text: str
    finish_reason: str
    usage: UsageOut
    timings: TimingsOut
    logprobs: list[TokenLogprobOut] | None = None


class SegmentInfo(BaseModel):
    id: str
    object: Literal["segment"] = "segment"
    kind: str
    tokens: int
    tier: Literal["gpu", "cpu", "disk", "none"] = Field(description="where the payload is; none: rebuilt on next use")
    pin: bool
    ttl: float | None
    bytes: int = Field(description="the payload's size (tier none: what rebuilding it takes; 0: never computed)")
    hits: int
    title: str | None = None
    created_at: float
    last_used_at: float
    metadata: dict[str, Any] = Field(default_factory=dict)
    hit: bool | None = Field(default=None, description="PUT only: already cached before this request")
    text: str | None = Field(default=None, description="GET one only: the framed text")


class SegmentList(BaseModel):
    object: Literal["list"] = "list"
    data: list[SegmentInfo]
    has_more: bool = False
    next: str | None = None


class SegmentDeleted(BaseModel):
    id: str
    object: Literal["segment"] = "segment"
    deleted: bool = True
