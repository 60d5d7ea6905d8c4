"""Tokenization per segment: each segment is framed and tokenized on its own.

NOTE: the prompt's token list is the concatenation of per-segment token lists (plus an
optional leading BOS piece and the suffix), for every mode. Tokenizing a segment on its own
can differ from tokenizing the joined text at a boundary; that is by design: all modes see
the same tokens, and a segment's tokens (hence its key) do not depend on its neighbours.
No special tokens are added inside a segment.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from hypic_agent.errors import InvalidRequestError
from hypic_agent.segments.prompt.framing import Framer
from hypic_agent.segments.prompt.keys import KeyContext, SegmentKey, token_digest
from hypic_agent.segments.prompt.kinds import CachePolicy, Segment, SegmentKind


class Tokenizer(Protocol):
    """Any object with these (a transformers ``PreTrainedTokenizerBase`` fits)."""

    bos_token_id: Any

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...


@dataclass(frozen=True)
class CanonicalSegment:
    """A framed, tokenized segment with its content key.

    ``token_ids [n]``; ``text`` is the framed text they came from (``None`` when resolved from a
    stored id whose text was not kept); ``ref`` is the stored id it was resolved from, if any.
    """

    kind: SegmentKind
    token_ids: tuple[int, ...]
    key: SegmentKey
    text: str | None
    title: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    cache: CachePolicy = field(default_factory=CachePolicy)
    ref: str | None = None

    def __post_init__(self) -> None:
        if not self.token_ids:
            raise InvalidRequestError(f"a {self.kind} segment framed to zero tokens", param="segments")

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def digest(self) -> str:
        """Token digest (``keys.token_digest``), to re-check a cache hit."""
        return token_digest(self.token_ids)


def encode(tokenizer: Tokenizer, text: str) -> tuple[int, ...]:
    """Token ids of ``text`` with no special tokens added."""
    return tuple(map(int, tokenizer.encode(text, add_special_tokens=False)))


def encode_many(tokenizer: Tokenizer, texts: list[str]) -> list[tuple[int, ...]]:
    """``encode`` of each text, in one batched call where the tokenizer has one (a transformers fast
    tokenizer encodes a batch on several threads): a 20-document prompt is one call, not 20."""
    if len(texts) < 2 or not callable(tokenizer):  # a bare ``encode``-only tokenizer: one text at a time
        return [encode(tokenizer, t) for t in texts]
    ids = tokenizer(texts, add_special_tokens=False, return_attention_mask=False)["input_ids"]
    return [tuple(map(int, x)) for x in ids]


def canonicalize(
    segment: Segment, tokenizer: Tokenizer, ctx: KeyContext, framer: Framer | None = None
) -> CanonicalSegment:
    """Frame, tokenize and key one segment given by content."""
    return canonicalize_many([segment], tokenizer, ctx, framer)[0]


def canonicalize_many(
    segments: list[Segment], tokenizer: Tokenizer, ctx: KeyContext, framer: Framer | None = None
) -> list[CanonicalSegment]:
    """Frame, tokenize (one batched call: ``encode_many``) and key segments given by content."""
    if any(s.ref is not None or s.kind is None for s in segments):
        raise InvalidRequestError("a segment given by id must be resolved, not tokenized", param="id")
    framer = framer or Framer(tokenizer)
    texts = [framer.frame(s) for s in segments]
    ids = encode_many(tokenizer, texts)
    return [_canonical(s, i, text, ctx) for s, i, text in zip(segments, ids, texts, strict=True)]


def _canonical(segment: Segment, ids: tuple[int, ...], text: str, ctx: KeyContext) -> CanonicalSegment:
    assert segment.kind is not None
    return CanonicalSegment(
        kind=segment.kind,
        token_ids=ids,
        key=ctx.key(ids),
        text=text,
        title=segment.title,
        metadata=segment.metadata,
        cache=segment.cache,
    )


def suffix_ids(query: str | None, tokenizer: Tokenizer, framer: Framer | None = None) -> tuple[int, ...]:
    """Tokens of the suffix: final user turn + generation prompt (never cached)."""
    framer = framer or Framer(tokenizer)
    return encode(tokenizer, framer.frame_suffix(query))


def detect_bos(tokenizer: Tokenizer) -> int | None:
    """The BOS id the tokenizer itself would prepend, or ``None`` if it adds none."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return None
    with_special = tokenizer.encode("a", add_special_tokens=True)
    return int(bos) if with_special and int(with_special[0]) == int(bos) else None
