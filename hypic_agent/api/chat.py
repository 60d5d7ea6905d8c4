"""OpenAI-compatible chat: wire schemas and messages -> segments + query.

How a conversation becomes segments (in this order):

1. leading ``system`` / ``developer`` messages -> ``system`` segments;
2. the extension field ``segments`` (native segment list: documents, stored ids, ...);
3. every other message -> one ``turn`` segment, except the last message when it is from the
   user: that one is the query (the uncached suffix);
4. ``tools`` (when given): the catalogue, placed after the system segments (one segment per
   function, ``hypic_agent/tools/catalogue.py``); an assistant message's ``tool_calls`` are
   part of its ``turn`` and a ``tool`` message (a function's result) is a ``turn`` of its own;
5. content blocks carrying ``cache_control`` (Anthropic style) are segment boundaries inside a
   message: the text up to and including such a block is a segment of its own (for the final
   user message, everything up to its last marked block becomes turn segments and the rest is
   the query).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from hypic_agent.api.schemas import SamplingIn
from hypic_agent.api.tool_schemas import ResponseFormatIn, ToolCallIn, ToolChoiceIn, ToolIn
from hypic_agent.errors import InvalidRequestError
from hypic_agent.segments.prompt.kinds import Message, Segment, SegmentIn
from hypic_agent.tools.format import ToolFormat, call_text
from hypic_agent.wire import MaxTokens, Temperature, Text, TopK, TopP

DEFAULT_CHAT_MAX_TOKENS = 256


class ContentBlock(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Text = "text"
    text: Text | None = None
    cache_control: dict[str, Any] | None = None


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[ContentBlock] | None = None
    name: Text | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: Text | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)  # "include_usage": "yes" is a type error

    include_usage: bool = False


class ChatRequest(SamplingIn):
    """OpenAI fields we honour (others are accepted and ignored) + extensions ``segments``,
    ``mode``, ``seam``, ``top_k``. Default temperature is 0 (greedy), unlike OpenAI's 1.
    ``tools`` / ``tool_choice`` / ``parallel_tool_calls`` / ``response_format``: docs/api.md."""

    model_config = ConfigDict(extra="allow")

    model: Text | None = None
    messages: list[ChatMessageIn] = Field(min_length=1)
    max_tokens: MaxTokens | None = None  # type: ignore[assignment]
    temperature: Temperature | None = None  # type: ignore[assignment]
    top_p: TopP | None = None  # type: ignore[assignment]
    top_k: TopK | None = None  # type: ignore[assignment]
    logprobs: bool | None = None  # type: ignore[assignment]
    max_completion_tokens: MaxTokens | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    segments: list[SegmentIn] | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20, description="needs logprobs=true")
    tools: list[ToolIn] | None = None
    tool_choice: ToolChoiceIn | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormatIn | None = None

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


def message_texts(req: ChatRequest) -> list[str]:
    """Every text of the messages, their tool calls and the tools (for the size check before tokenizing)."""
    out: list[str] = []
    for m in req.messages:
        if isinstance(m.content, str):
            out.append(m.content)
        elif m.content is not None:
            out.extend(b.text or "" for b in m.content)
        out.extend(c.function.arguments for c in m.tool_calls or [])
    out.extend(json.dumps(t.function.parameters or {}) + (t.function.description or "") for t in req.tools or [])
    return out


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


def _turn(role: str, text: str, calls: tuple[tuple[str, str], ...] = ()) -> Segment | None:
    if not text.strip() and not calls:
        return None
    return Segment(kind="turn", messages=(Message(role=_role(role), content=text, tool_calls=calls),))


def _calls(msg: ChatMessageIn, text: str, fmt: ToolFormat) -> tuple[str, tuple[tuple[str, str], ...]]:
    """An assistant message's text and calls: the calls go to the template when it renders them,
    else they are written into the text in the default format (``tools/format.py``)."""
    calls = tuple((c.function.name, c.function.arguments) for c in msg.tool_calls or [])
    if not calls or fmt.template_tools:
        return text, calls
    written = "\n".join(call_text(name, args, fmt.syntax) for name, args in calls)
    return (f"{text}\n{written}" if text.strip() else written), ()


def chat_to_segments(req: ChatRequest, fmt: ToolFormat | None = None) -> tuple[list[Segment], str | None]:
    """Segments and query of a chat request (see the module doc; the tool catalogue is added by
    ``tools.catalogue.with_tools``, which needs the server's framer)."""
    fmt = fmt or ToolFormat()
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
        rest, calls = _calls(m, rest, fmt) if m.role == "assistant" else (rest, ())
        turns = [_turn(m.role, p) for p in closed] + [_turn(m.role, rest, calls)]
        out.extend(s for s in turns if s is not None)
    out.extend(tail_segments)
    return out, query
