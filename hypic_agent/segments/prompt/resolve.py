"""Resolving segments given by ``id``: a stored row's tokens become a ``CanonicalSegment``.

The key is recomputed from the stored tokens under the request's ``KeyContext`` (a request
may use another seam than the one the id was registered under: same tokens, other key).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from hypic_agent.errors import InvalidRequestError, SegmentNotFoundError
from hypic_agent.segments.prompt.keys import KeyContext, token_digest
from hypic_agent.segments.prompt.kinds import Segment
from hypic_agent.segments.prompt.plan import Resolver
from hypic_agent.segments.prompt.tokenize import CanonicalSegment


class StoredSegment(Protocol):
    """What resolving reads of a stored row (the store's ``EntryRecord`` is one)."""

    @property
    def kind(self) -> str: ...
    @property
    def model_fingerprint(self) -> str: ...
    @property
    def token_ids(self) -> tuple[int, ...] | None: ...
    @property
    def token_digest(self) -> str | None: ...
    @property
    def text(self) -> str | None: ...
    @property
    def title(self) -> str | None: ...
    @property
    def meta(self) -> Mapping[str, Any]: ...


Lookup = Callable[[str, str], StoredSegment | None]
"""``(id, tenant) -> row with token ids``: ``Registry.get`` or ``SegmentStore.info``."""


def stored_resolver(lookup: Lookup, ctx: KeyContext) -> Resolver:
    def resolve(seg: Segment) -> CanonicalSegment:
        assert seg.ref is not None
        rec = lookup(seg.ref, ctx.tenant)
        if rec is None or rec.token_ids is None:
            raise SegmentNotFoundError(
                f"no stored segment with id {seg.ref!r}; register it with PUT /v1/segments or send it by text",
                param="id",
            )
        if rec.model_fingerprint != ctx.model_fingerprint:
            raise SegmentNotFoundError(
                f"segment {seg.ref!r} was stored for another model; send it by text to use it with this one",
                param="id",
            )
        if rec.token_digest is not None and token_digest(rec.token_ids) != rec.token_digest:
            raise SegmentNotFoundError(f"stored segment {seg.ref!r} is damaged; send it by text again", param="id")
        if seg.kind is not None and seg.kind != rec.kind:
            raise InvalidRequestError(
                f"segment {seg.ref!r} is a {rec.kind!r} segment, not {seg.kind!r}; drop 'kind' or fix it", param="kind"
            )
        return CanonicalSegment(
            kind=rec.kind,  # type: ignore[arg-type]
            token_ids=rec.token_ids,
            key=ctx.key(rec.token_ids),
            text=rec.text,
            title=seg.title or rec.title,
            metadata=seg.metadata or rec.meta,
            cache=seg.cache,
            ref=seg.ref,
        )

    return resolve
