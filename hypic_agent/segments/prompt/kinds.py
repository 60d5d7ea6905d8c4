"""Segment kinds: the wire models (pydantic, at the edge) and the frozen ``Segment`` inside.

A segment is one cacheable piece of a prompt. On the wire it comes either *by content*
(``text``, or ``messages`` for a ``turn``) or *by reference* (``id`` of a segment stored
earlier with ``PUT /v1/segments``); a reference may omit ``kind``.

    {"kind": "document", "text": "Paris is the capital of France.", "title": "Paris"}
    {"kind": "turn", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    {"id": "5f0c...", "cache": {"pin": true}}

``SegmentIn`` is a discriminated union on ``kind`` (a missing kind with an ``id`` selects the
reference model); ``SegmentIn`` values turn into ``Segment`` dataclasses with ``to_segment()``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, TypeAdapter, model_validator

from hypic_agent.errors import InvalidRequestError
from hypic_agent.wire import JsonObject, Text

SegmentKind = Literal["system", "document", "skill", "memory", "turn", "text"]
KINDS: tuple[str, ...] = get_args(SegmentKind)
Role = Literal["system", "user", "assistant", "tool"]
ROLES: tuple[str, ...] = get_args(Role)


# --------------------------------------------------------------------------- inside


@dataclass(frozen=True)
class CachePolicy:
    """``pin``: never evicted by the budget policy. ``ttl``: seconds after last use, then dropped."""

    pin: bool = False
    ttl: float | None = None

    def __post_init__(self) -> None:
        if self.ttl is not None and not 0 < self.ttl < math.inf:
            raise InvalidRequestError(f"cache.ttl must be finite and > 0 seconds, got {self.ttl}", param="cache.ttl")


@dataclass(frozen=True)
class Message:
    """One chat message. ``tool_calls``: an assistant's calls as ``(name, arguments JSON)`` pairs,
    passed to chat templates that render them (``hypic_agent/tools/format.py``)."""

    role: str
    content: str
    tool_calls: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Segment:
    """One prompt segment, validated. Exactly one of ``text`` / ``messages`` / ``ref`` is set.

    ``ref`` is the id of a stored segment; its ``kind`` is then the expected kind or ``None``
    (any kind). ``messages`` is only for ``turn``; ``text`` for every other kind.
    """

    kind: SegmentKind | None
    text: str | None = None
    messages: tuple[Message, ...] | None = None
    ref: str | None = None
    title: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    cache: CachePolicy = field(default_factory=CachePolicy)

    def __post_init__(self) -> None:
        given = [name for name in ("text", "messages", "ref") if getattr(self, name) is not None]
        if len(given) != 1:
            raise InvalidRequestError(
                f"a segment needs exactly one of text, messages or id; got {given or 'none'}", param="segments"
            )
        if self.kind is not None and self.kind not in KINDS:
            raise InvalidRequestError(f"unknown segment kind {self.kind!r}; use one of {KINDS}", param="kind")
        if self.ref is None and self.kind is None:
            raise InvalidRequestError("a segment given by content needs a kind", param="kind")
        if self.messages is not None and self.kind != "turn":
            raise InvalidRequestError(f"messages are only for kind 'turn', not {self.kind!r}", param="messages")
        if self.text is not None and self.kind == "turn":
            raise InvalidRequestError("a turn segment takes messages, not text", param="text")
        if self.text is not None and not self.text.strip():
            raise InvalidRequestError("segment text must not be empty", param="text")
        if self.messages is not None and not self.messages:
            raise InvalidRequestError("a turn segment needs at least one message", param="messages")
        if not isinstance(self.metadata, MappingProxyType):
            object.__setattr__(self, "metadata", MappingProxyType(dict(self.metadata)))

    @property
    def is_ref(self) -> bool:
        return self.ref is not None


# --------------------------------------------------------------------------- wire


class CacheIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # "pin": "yes" is a type error, not true
    pin: bool = False
    ttl: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, description="seconds after last use (finite); none = no expiry"
    )


class MessageIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Role
    content: Text = Field(min_length=1)


class _SegmentBase(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: Text | None = Field(default=None, min_length=1, max_length=128, description="id of a stored segment")
    title: Text | None = Field(default=None, max_length=512)
    metadata: JsonObject = Field(default_factory=dict, description="free-form JSON, stored with the segment")
    cache: CacheIn = Field(default_factory=CacheIn)

    def _policy(self) -> CachePolicy:
        return CachePolicy(pin=self.cache.pin, ttl=self.cache.ttl)


class _TextSegmentIn(_SegmentBase):
    model_config = ConfigDict(json_schema_extra={"anyOf": [{"required": ["text"]}, {"required": ["id"]}]})

    text: Text | None = Field(default=None, description="content; framed per kind")

    @model_validator(mode="after")
    def _one_source(self) -> _TextSegmentIn:
        if (self.text is None) == (self.id is None):
            both = "both" if self.text is not None else "neither"
            raise ValueError(f"give exactly one of 'text' or 'id' ({both} given)")
        if self.text is not None and not self.text.strip():
            raise ValueError("'text' must not be empty or only whitespace")
        return self

    def to_segment(self) -> Segment:
        kind: SegmentKind = self.kind  # type: ignore[attr-defined]
        return Segment(
            kind=kind, text=self.text, ref=self.id, title=self.title, metadata=self.metadata, cache=self._policy()
        )


class SystemSegmentIn(_TextSegmentIn):
    kind: Literal["system"]


class DocumentSegmentIn(_TextSegmentIn):
    kind: Literal["document"]


class SkillSegmentIn(_TextSegmentIn):
    kind: Literal["skill"]


class MemorySegmentIn(_TextSegmentIn):
    kind: Literal["memory"]


class TextSegmentIn(_TextSegmentIn):
    """Raw text, no framing at all."""

    kind: Literal["text"]


class TurnSegmentIn(_SegmentBase):
    """Chat turns, rendered with the model's chat template."""

    model_config = ConfigDict(json_schema_extra={"anyOf": [{"required": ["messages"]}, {"required": ["id"]}]})

    kind: Literal["turn"]
    messages: list[MessageIn] | None = None

    @model_validator(mode="after")
    def _one_source(self) -> TurnSegmentIn:
        if (self.messages is None) == (self.id is None):
            both = "both" if self.messages is not None else "neither"
            raise ValueError(f"a turn needs exactly one of 'messages' or 'id' ({both} given)")
        if self.messages is not None and not self.messages:
            raise ValueError("'messages' must hold at least one message")
        return self

    def to_segment(self) -> Segment:
        msgs = None
        if self.messages is not None:
            msgs = tuple(Message(role=m.role, content=m.content) for m in self.messages)
        return Segment(
            kind="turn", messages=msgs, ref=self.id, title=self.title, metadata=self.metadata, cache=self._policy()
        )


class SegmentRefIn(_SegmentBase):
    """A stored segment by id, kind left open: ``{"id": "..."}``."""

    id: Text = Field(min_length=1, max_length=128)

    def to_segment(self) -> Segment:
        return Segment(kind=None, ref=self.id, title=self.title, metadata=self.metadata, cache=self._policy())


def _segment_tag(value: Any) -> str | None:
    """Discriminator: the ``kind``, or ``"ref"`` for a kind-less ``{"id": ...}``."""
    get = value.get if isinstance(value, dict) else lambda name: getattr(value, name, None)
    kind = get("kind")
    if kind is None:
        return "ref" if get("id") is not None else None
    return kind if kind in KINDS else None


SegmentIn = Annotated[
    Annotated[SystemSegmentIn, Tag("system")]
    | Annotated[DocumentSegmentIn, Tag("document")]
    | Annotated[SkillSegmentIn, Tag("skill")]
    | Annotated[MemorySegmentIn, Tag("memory")]
    | Annotated[TurnSegmentIn, Tag("turn")]
    | Annotated[TextSegmentIn, Tag("text")]
    | Annotated[SegmentRefIn, Tag("ref")],
    Discriminator(
        _segment_tag,
        custom_error_type="invalid_segment_kind",
        custom_error_message=(
            f"'kind' must be one of {', '.join(KINDS)} (or leave it out and give the 'id' of a stored segment)"
        ),
    ),
]
"""Wire model of one segment (use as a field type: ``segments: list[SegmentIn]``)."""

_ADAPTER: TypeAdapter[Any] = TypeAdapter(SegmentIn)


def parse_segment(obj: Any) -> Segment:
    """Validate one wire segment (dict or JSON-like) into a ``Segment``.

    Raises ``pydantic.ValidationError`` (the API maps it onto a 422 envelope).
    """
    return _ADAPTER.validate_python(obj).to_segment()
