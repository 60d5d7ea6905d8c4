"""Typed response objects. All of them accept extra fields, so the server can add fields freely.

Unknown fields stay reachable as attributes (``resp.some_new_field``) and in ``model_dump()``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator


class HypicModel(BaseModel):
    """Base of every wire model: permissive (extra fields kept), no protected namespaces."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, protected_namespaces=())


# --- /v1/generate ----------------------------------------------------------------------------


class SegmentUsage(HypicModel):
    """One prompt segment as the server used it: ``hit`` = served from cache, ``tier`` = where."""

    id: str | None = None
    kind: str | None = None
    tokens: int = 0
    hit: bool = False
    tier: str | None = None


class Usage(HypicModel):
    """Token accounting. ``cached_tokens + recomputed_tokens`` covers the prompt."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    recomputed_tokens: int = 0
    segments: list[SegmentUsage] = Field(default_factory=list)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class Timings(HypicModel):
    """Server-side latencies in milliseconds."""

    ttft_ms: float | None = None
    total_ms: float | None = None


class TokenLogprob(HypicModel):
    """Log-probability of one generated token."""

    token: str | None = None
    token_id: int | None = None
    logprob: float | None = None


def _coerce_logprobs(value: Any) -> Any:
    """Accept ``[{...}]``, bare floats ``[-0.1, ...]`` or OpenAI's ``{"content": [...]}``."""
    if isinstance(value, dict) and isinstance(value.get("content"), list):
        value = value["content"]
    if isinstance(value, list):
        return [{"logprob": v} if isinstance(v, (int, float)) else v for v in value]
    return value


class GenerateResponse(HypicModel):
    """Body of a non-streaming ``POST /v1/generate``."""

    id: str | None = None
    text: str = ""
    finish_reason: str | None = None
    usage: Usage = Field(default_factory=Usage)
    timings: Timings = Field(default_factory=Timings)
    logprobs: list[TokenLogprob] | None = None

    _coerce = field_validator("logprobs", mode="before")(_coerce_logprobs)


class GenerateChunk(HypicModel):
    """One SSE event of a streaming generate: a text delta, or the final event with usage."""

    id: str | None = None
    text: str = ""
    token_id: int | None = None
    logprob: float | None = None
    finish_reason: str | None = None
    usage: Usage | None = None
    timings: Timings | None = None

    @property
    def is_final(self) -> bool:
        return self.finish_reason is not None or self.usage is not None


# --- /v1/segments ----------------------------------------------------------------------------


class SegmentInfo(HypicModel):
    """A stored segment as the registry describes it."""

    id: str
    kind: str | None = None
    tokens: int | None = None
    tier: str | None = None
    pin: bool | None = None
    ttl: float | None = None
    bytes: int | None = None
    hits: int | None = None
    title: str | None = None


class SegmentPage(HypicModel):
    """One page of ``GET /v1/segments``; pass ``next`` as ``after=`` for the next page."""

    data: list[SegmentInfo] = Field(default_factory=list)
    has_more: bool = False
    next: str | None = None

    def __iter__(self) -> Iterator[SegmentInfo]:  # type: ignore[override]
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)


class SegmentDeleted(HypicModel):
    id: str
    deleted: bool = True


# --- OpenAI-compatible passthrough -----------------------------------------------------------


class FunctionCall(HypicModel):
    """A called function: ``arguments`` is JSON text (``.parsed_arguments()`` decodes it)."""

    name: str = ""
    arguments: str = ""

    def parsed_arguments(self) -> Any:
        return json.loads(self.arguments or "{}")


class ToolCall(HypicModel):
    """One tool call of an assistant message (``finish_reason == "tool_calls"``)."""

    id: str | None = None
    type: str = "function"
    function: FunctionCall = Field(default_factory=FunctionCall)


class ToolCallDelta(HypicModel):
    """A streamed piece of a tool call; pieces with the same ``index`` add up to one call."""

    index: int = 0
    id: str | None = None
    type: str | None = None
    function: FunctionCall | None = None


class ChatMessage(HypicModel):
    role: str = "assistant"
    content: str | list[Any] | None = None
    tool_calls: list[ToolCall] | None = None

    def parsed(self) -> Any:
        """The content decoded as JSON (for ``response_format`` json_object / json_schema)."""
        if not isinstance(self.content, str):
            raise ValueError("the message has no text content to parse")
        return json.loads(self.content)


class ChatChoice(HypicModel):
    index: int = 0
    message: ChatMessage = Field(default_factory=ChatMessage)
    finish_reason: str | None = None
    logprobs: Any = None


class PromptTokensDetails(HypicModel):
    cached_tokens: int = 0


class ChatUsage(HypicModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None


class ChatCompletion(HypicModel):
    """``POST /v1/chat/completions`` response (OpenAI shape, extra fields kept)."""

    id: str | None = None
    object: str = "chat.completion"
    created: int | None = None
    model: str | None = None
    choices: list[ChatChoice] = Field(default_factory=list)
    usage: ChatUsage | None = None


class ChatDelta(HypicModel):
    role: str | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(HypicModel):
    index: int = 0
    delta: ChatDelta = Field(default_factory=ChatDelta)
    finish_reason: str | None = None
    logprobs: Any = None


class ChatCompletionChunk(HypicModel):
    id: str | None = None
    object: str = "chat.completion.chunk"
    created: int | None = None
    model: str | None = None
    choices: list[ChatChunkChoice] = Field(default_factory=list)
    usage: ChatUsage | None = None


# --- /v1/models, /health ---------------------------------------------------------------------


class Model(HypicModel):
    id: str
    object: str = "model"
    owned_by: str | None = None


class ModelList(HypicModel):
    object: str = "list"
    data: list[Model] = Field(default_factory=list)

    def __iter__(self) -> Iterator[Model]:  # type: ignore[override]
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)


class Health(HypicModel):
    status: str = "ok"
