"""OpenAI-compatible chat: wire schemas and messages -> segments + query.

How a conversation becomes segments (in this order):

1. leading ``system`` / ``developer`` messages -> ``system`` segments;
2. the extension field ``segments`` (native segment list: documents, stored ids, ...);
3. every other message -> one ``turn`` segment, except the last message when it is from the
   user: that one is the query (the uncached suffix);
4. content blocks carrying ``cache_control`` (Anthropic style) are segment boundaries inside a
   message: the text up to and including such a block is a segment of its own (for the final
   user message, everything up to its last marked block becomes turn segments and the rest is
   the query).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from hypic_agent.api.schemas import SamplingIn
from hypic_agent.errors import InvalidRequestError
from hypic_agent.segments.kinds import Message, Segment, SegmentIn

DEFAULT_CHAT_MAX_TOKENS = 256


class ContentBlock(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str = "text"
    text: str | None = None
    cache_control: dict[str, Any] | None = None


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentBlock] | None = None
    name: str | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool = False


class ChatRequest(SamplingIn):
    """OpenAI fields we honour (others are accepted and ignored) + extensions ``segments``,
    ``mode``, ``seam``, ``top_k``. Default temperature is 0 (greedy), unlike OpenAI's 1."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    messages: list[ChatMessageIn] = Field(min_length=1)
    max_tokens: int | None = None  # type: ignore[assignment]
    temperature: float | None = None  # type: ignore[assignment]
    top_p: float | None = None  # type: ignore[assignment]
    top_k: int | None = None  # type: ignore[assignment]
    logprobs: bool | None = None  # type: ignore[assignment]
    max_completion_tokens: int | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    segments: list[SegmentIn] | None = None

    def to_sampling(self) -> SamplingIn:
        """The native sampling fields (OpenAI's nulls become our defaults)."""
        max_tokens = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        return SamplingIn(
            max_tokens=DEFAULT_CHAT_MAX_TOKENS if max_tokens is None else max_tokens,
            temperature=0.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k or 0,
            stop=self.stop,
            seed=self.seed,
            logprobs=bool(self.logprobs),
            mode=self.mode,
            seam=self.seam,
        )


def _pieces(msg: ChatMessageIn, index: int) -> tuple[list[str], str]:
    """``(closed pieces, open tail)``: text split after every block with ``cache_control``."""
    if msg.content is None:
        return [], ""
    if isinstance(msg.content, str):
        return [], msg.content
    closed: list[str] = []
    current: list[str] = []
    for j, block in enumerate(msg.content):
        if block.type not in ("text", "input_text"):
            raise InvalidRequestError(
                f"content block type {block.type!r} is not supported (text only)", param=f"messages.{index}.content.{j}"
            )
        current.append(block.text or "")
        if block.cache_control is not None:
            closed.append("\n".join(current))
            current = []
    return closed, "\n".join(current)


def _role(role: str) -> str:
    return "system" if role == "developer" else role


def _turn(role: str, text: str) -> Segment | None:
    if not text.strip():
        return None
    return Segment(kind="turn", messages=(Message(role=_role(role), content=text),))


def chat_to_segments(req: ChatRequest) -> tuple[list[Segment], str | None]:
    """Segments and query of a chat request (see the module doc)."""
    if req.n != 1:
        raise InvalidRequestError("only n=1 is supported", param="n")
    msgs = list(enumerate(req.messages))
    query: str | None = None
    tail_segments: list[Segment] = []
    if msgs and msgs[-1][1].role == "user":
        i, last = msgs.pop()
        closed, rest = _pieces(last, i)
        tail_segments = [s for s in (_turn("user", p) for p in closed) if s is not None]
        query = rest if rest.strip() else None
    out: list[Segment] = []
    while msgs and msgs[0][1].role in ("system", "developer"):
        i, m = msgs.pop(0)
        closed, rest = _pieces(m, i)
        for text in [*closed, rest]:
            if text.strip():
                out.append(Segment(kind="system", text=text))
    out.extend(s.to_segment() for s in req.segments or [])
    for i, m in msgs:
        closed, rest = _pieces(m, i)
        out.extend(s for s in (_turn(m.role, p) for p in [*closed, rest]) if s is not None)
    out.extend(tail_segments)
    return out, query
