"""Prompt segments and their builders.

A prompt is a list of segments, each framed and cached on its own by the server (position
independent: the same document hits the cache wherever it appears). Content comes either as
``text`` (``messages`` for turns) or as the ``id`` of a segment stored with ``PUT /v1/segments``.

Anything accepted where a segment is expected (``SegmentLike``): a :class:`Segment`, a plain dict
in the wire shape, or a ``str`` (a ``text`` segment).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, model_validator

SegmentKind = Literal["system", "document", "skill", "memory", "turn", "text"]
Role = Literal["system", "user", "assistant", "tool"]


class CachePolicy(BaseModel):
    """``pin`` keeps the entry from eviction; ``ttl`` (seconds) bounds its life."""

    model_config = ConfigDict(extra="allow")

    pin: bool | None = None
    ttl: float | None = None


class Message(BaseModel):
    """One chat message inside a ``turn`` segment."""

    model_config = ConfigDict(extra="allow")

    role: str
    content: str


class Segment(BaseModel):
    """One prompt segment, as sent on the wire (``model_dump(exclude_none=True)``)."""

    model_config = ConfigDict(extra="allow")

    kind: SegmentKind | None = None
    text: str | None = None
    messages: list[Message] | None = None
    id: str | None = None
    title: str | None = None
    cache: CachePolicy | None = None
    metadata: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _has_content(self) -> Segment:
        if self.id is None and self.text is None and not self.messages:
            raise ValueError("a segment needs `text`, `messages` (for turns) or the `id` of a stored segment")
        if self.kind == "turn" and self.text is not None and not self.messages:
            raise ValueError("a turn segment carries `messages`, not `text`: use turn(role, content)")
        return self

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


SegmentLike: TypeAlias = Segment | Mapping[str, Any] | str


def _cache(pin: bool | None, ttl: float | None) -> CachePolicy | None:
    return None if pin is None and ttl is None else CachePolicy(pin=pin, ttl=ttl)


def _text_segment(
    kind: SegmentKind,
    text: str,
    title: str | None,
    pin: bool | None,
    ttl: float | None,
    metadata: Mapping[str, Any] | None,
) -> Segment:
    if not isinstance(text, str):
        raise TypeError(f"{kind} text must be a str, got {type(text).__name__}")
    return Segment(
        kind=kind,
        text=text,
        title=title,
        cache=_cache(pin, ttl),
        metadata=dict(metadata) if metadata else None,
    )


def doc(
    text: str,
    title: str | None = None,
    *,
    pin: bool | None = None,
    ttl: float | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> Segment:
    """A retrieved or attached document (the typical cache hit)."""
    return _text_segment("document", text, title, pin, ttl, metadata)


def skill(
    text: str,
    name: str | None = None,
    *,
    pin: bool | None = None,
    ttl: float | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> Segment:
    """A tool/skill description an agent loads on demand; ``name`` becomes the title."""
    return _text_segment("skill", text, name, pin, ttl, metadata)


def memory(
    text: str,
    title: str | None = None,
    *,
    pin: bool | None = None,
    ttl: float | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> Segment:
    """A long-term memory record of an agent."""
    return _text_segment("memory", text, title, pin, ttl, metadata)


def system(
    text: str,
    *,
    pin: bool | None = None,
    ttl: float | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> Segment:
    """The system prompt."""
    return _text_segment("system", text, None, pin, ttl, metadata)


def text(
    content: str,
    *,
    pin: bool | None = None,
    ttl: float | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> Segment:
    """Plain text framed with no template (a bare ``str`` in a segment list means the same)."""
    return _text_segment("text", content, None, pin, ttl, metadata)


def turn(
    role: str,
    content: str,
    *,
    pin: bool | None = None,
    ttl: float | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> Segment:
    """One conversation turn (``role`` in user/assistant/tool/system)."""
    return Segment(
        kind="turn",
        messages=[Message(role=role, content=content)],
        cache=_cache(pin, ttl),
        metadata=dict(metadata) if metadata else None,
    )


def turns(messages: Iterable[Mapping[str, Any] | Message], *, pin: bool | None = None) -> list[Segment]:
    """One ``turn`` segment per message, so every earlier turn stays a cache hit as the chat grows.

    ``messages`` are OpenAI-style dicts ``{"role", "content"}``; system messages become
    ``system`` segments.
    """
    out: list[Segment] = []
    for m in messages:
        msg = m if isinstance(m, Message) else Message(**dict(m))
        if msg.role == "system":
            out.append(system(msg.content, pin=pin))
        else:
            out.append(turn(msg.role, msg.content, pin=pin))
    return out


def ref(id: str) -> Segment:
    """A segment already stored on the server (``PUT /v1/segments`` returned its id)."""
    if not id or not isinstance(id, str):
        raise ValueError("ref() needs the non-empty id returned by segments.put()")
    return Segment(id=id)


def to_segment(value: SegmentLike) -> Segment:
    """Normalize a :data:`SegmentLike` to a validated :class:`Segment`."""
    if isinstance(value, Segment):
        return value
    if isinstance(value, str):
        return text(value)
    if isinstance(value, Mapping):
        return Segment.model_validate(dict(value))
    raise TypeError(
        f"expected a Segment, a dict or a str, got {type(value).__name__}; build one with doc(), turn(), ref()"
    )


def segments_to_wire(values: SegmentLike | Sequence[SegmentLike]) -> list[dict[str, Any]]:
    """A single segment or a list of them -> list of wire dicts (validated)."""
    if isinstance(values, (Segment, str, Mapping)):
        values = [values]
    return [to_segment(v).to_wire() for v in values]


__all__ = [
    "CachePolicy",
    "Message",
    "Segment",
    "SegmentKind",
    "SegmentLike",
    "doc",
    "memory",
    "ref",
    "segments_to_wire",
    "skill",
    "system",
    "text",
    "to_segment",
    "turn",
    "turns",
]
