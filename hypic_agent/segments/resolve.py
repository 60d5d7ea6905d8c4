"""Resolving segments given by ``id``: a stored row's tokens become a ``CanonicalSegment``.

The key is recomputed from the stored tokens under the request's ``KeyContext`` (a request
may use another seam than the one the id was registered under: same tokens, other key).
"""

from __future__ import annotations

from collections.abc import Callable

from hypic_agent.errors import InvalidRequestError, SegmentNotFoundError
from hypic_agent.segments.keys import KeyContext, token_digest
from hypic_agent.segments.kinds import Segment
from hypic_agent.segments.plan import Resolver
from hypic_agent.segments.registry import EntryRecord
from hypic_agent.segments.tokenize import CanonicalSegment

Lookup = Callable[[str, str], EntryRecord | None]
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
