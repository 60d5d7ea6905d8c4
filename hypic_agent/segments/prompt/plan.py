"""``PromptPlan``: the ordered canonical segments of one request plus its uncached suffix.

Prompt layout (positions are global token indices)::

    [bos?] [segment 0] [segment 1] ... [segment n-1] [suffix]
     0      offsets[0]  offsets[1]      offsets[n-1]  suffix_offset

``token_ids()`` is the same list for every mode, so modes are compared on identical tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate

from hypic_agent.errors import ContextLengthError, InvalidRequestError
from hypic_agent.segments.prompt.framing import Framer
from hypic_agent.segments.prompt.keys import KeyContext, SegmentKey
from hypic_agent.segments.prompt.kinds import Segment
from hypic_agent.segments.prompt.tokenize import (
    CanonicalSegment,
    Tokenizer,
    canonicalize_many,
    detect_bos,
    suffix_ids,
)

Resolver = Callable[[Segment], CanonicalSegment]
"""Turns a segment given by id into its canonical form (see ``resolve.py``)."""


@dataclass(frozen=True)
class PromptPlan:
    """Ordered segments ``[n]``, suffix ids ``[m]``, optional BOS (its own leading piece)."""

    segments: tuple[CanonicalSegment, ...]
    suffix_ids: tuple[int, ...] = ()
    bos_id: int | None = None

    def __post_init__(self) -> None:
        if not self.segments and not self.suffix_ids:
            raise InvalidRequestError("the prompt is empty: give segments or a query", param="segments")

    @property
    def bos_len(self) -> int:
        return 0 if self.bos_id is None else 1

    @property
    def total_tokens(self) -> int:
        return self.bos_len + sum(s.n_tokens for s in self.segments) + len(self.suffix_ids)

    @property
    def segment_tokens(self) -> int:
        return sum(s.n_tokens for s in self.segments)

    def token_ids(self) -> list[int]:
        """The whole prompt ``[total_tokens]``: bos + segment tokens + suffix tokens."""
        ids: list[int] = [] if self.bos_id is None else [self.bos_id]
        for seg in self.segments:
            ids.extend(seg.token_ids)
        ids.extend(self.suffix_ids)
        return ids

    def offsets(self) -> list[int]:
        """Start position of each segment ``[n]``."""
        lengths = [s.n_tokens for s in self.segments]
        return list(accumulate(lengths[:-1], initial=self.bos_len)) if lengths else []

    @property
    def suffix_offset(self) -> int:
        return self.bos_len + self.segment_tokens

    def keys(self) -> list[SegmentKey]:
        return [s.key for s in self.segments]

    def check_fits(self, max_context: int, max_new_tokens: int = 0) -> None:
        """Raise ``ContextLengthError`` if prompt + completion exceed ``max_context``."""
        need = self.total_tokens + max_new_tokens
        if need > max_context:
            raise ContextLengthError(
                f"prompt has {self.total_tokens} tokens and max_tokens is {max_new_tokens}: {need} > the context "
                f"limit {max_context}; send fewer or shorter segments or lower max_tokens",
                param="segments",
            )


def build_plan(
    segments: Sequence[Segment],
    query: str | None,
    tokenizer: Tokenizer,
    ctx: KeyContext,
    *,
    framer: Framer | None = None,
    add_bos: bool | None = None,
    resolve: Resolver | None = None,
) -> PromptPlan:
    """Frame, tokenize and key every segment, then the suffix.

    ``add_bos=None`` prepends BOS exactly when the tokenizer itself would. Segments given by
    id go through ``resolve`` (required when any is present).
    """
    if not segments and query is None:  # an empty query is a prompt: the generation prompt alone
        raise InvalidRequestError("the prompt is empty: give segments or a query", param="segments")
    framer = framer or Framer(tokenizer)
    stored: dict[int, CanonicalSegment] = {}
    for i, seg in enumerate(segments):
        if seg.ref is not None:
            if resolve is None:
                raise InvalidRequestError(
                    f"segments[{i}] refers to id {seg.ref!r} but no store is available", param="id"
                )
            stored[i] = resolve(seg)
    # segments given by content: tokenized in one batch, then put back in the request's order
    by_content = iter(canonicalize_many([s for s in segments if s.ref is None], tokenizer, ctx, framer))
    canon = tuple(stored[i] if i in stored else next(by_content) for i in range(len(segments)))
    bos = detect_bos(tokenizer) if add_bos is None or add_bos else None
    if add_bos and bos is None:
        bos_id = getattr(tokenizer, "bos_token_id", None)
        if bos_id is None:
            raise InvalidRequestError("add_bos was requested but the tokenizer has no BOS token", param="add_bos")
        bos = int(bos_id)
    return PromptPlan(segments=canon, suffix_ids=suffix_ids(query, tokenizer, framer), bos_id=bos)
