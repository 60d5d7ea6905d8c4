"""Segment registration and administration: ``PUT/GET/PATCH/DELETE /v1/segments``.

Stored ids are the segments' content keys (``xxh3_128`` over model fingerprint, tenant, seam and
tokens): putting the same content twice returns the same id, and another tenant's id is simply
not found. Registering pre-warms: each cacheable segment gets its entry now (one packed prefill
of the cold ones); segments too short to cache are recorded as definitions only.
Blocking: call from a worker thread.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from pydantic_core import PydanticCustomError

from hypic_agent.api.errors import TooManySegmentsError
from hypic_agent.api.limits import RequestLimits
from hypic_agent.api.schemas import PatchSegmentRequest, PutSegmentsRequest, SegmentInfo, SegmentList
from hypic_agent.api.service import key_context, resolve_mode
from hypic_agent.api.state import ServerState
from hypic_agent.errors import InvalidRequestError, SegmentNotFoundError
from hypic_agent.runtime.hypic.modes import mode_spec, seam_tokens
from hypic_agent.runtime.hypic.store_cache import EntryHint
from hypic_agent.segments.prompt.resolve import stored_resolver
from hypic_agent.segments.prompt.tokenize import CanonicalSegment, canonicalize
from hypic_agent.segments.store.entries import EntryMeta
from hypic_agent.segments.store.quota import EntryTooLargeError, PinQuotaError
from hypic_agent.segments.store.record import EntryRecord
from hypic_agent.wire import check_json, json_depth

log = logging.getLogger("hypic.api")

STORED_METADATA_DEPTH = 64
"""Rows stored before metadata was limited may nest deeper than a response can serialize."""


def readable_metadata(rec: EntryRecord) -> dict[str, Any]:
    """The row's metadata, or ``{}`` (logged) for a row whose metadata no response could carry."""
    meta: Mapping[str, Any] = rec.meta or {}
    try:
        if json_depth(meta) > STORED_METADATA_DEPTH:
            raise ValueError(f"nests over {STORED_METADATA_DEPTH} levels")
        check_json(meta)
    except (ValueError, PydanticCustomError) as exc:
        log.warning("segment %s: stored metadata left out of the response (%s)", rec.key, exc)
        return {}
    return dict(meta)


def info_of(rec: EntryRecord, *, hit: bool | None = None, with_text: bool = False) -> SegmentInfo:
    return SegmentInfo(
        id=rec.key,
        kind=rec.kind,
        tokens=rec.n_tokens,
        tier=rec.tier,
        pin=rec.pinned,
        ttl=rec.ttl_s,
        bytes=rec.nbytes,
        hits=rec.hits,
        title=rec.title,
        created_at=rec.created_at,
        last_used_at=rec.last_used_at,
        metadata=readable_metadata(rec),
        hit=hit,
        text=rec.text if with_text else None,
    )


def _not_found(segment_id: str) -> SegmentNotFoundError:
    return SegmentNotFoundError(
        f"no stored segment with id {segment_id!r} for this API key; list yours with GET /v1/segments", param="id"
    )


def canonical_segments(
    st: ServerState, req: PutSegmentsRequest, tenant: str, key_seam: float
) -> list[CanonicalSegment]:
    if not req.segments:
        raise InvalidRequestError("segments must not be empty: give at least one segment to store", param="segments")
    if len(req.segments) > st.settings.max_segments:
        raise TooManySegmentsError(
            f"{len(req.segments)} segments in one request; the limit is {st.settings.max_segments}", param="segments"
        )
    RequestLimits(st.settings, st.engine.max_context).check_segments(req.segments, each=True)
    ctx = key_context(st, tenant, key_seam)
    resolve = stored_resolver(st.store.info, ctx)
    out: list[CanonicalSegment] = []
    for wire in req.segments:
        seg = wire.to_segment()
        cs = resolve(seg) if seg.ref is not None else canonicalize(seg, st.engine.tokenizer, ctx, st.framer)
        if cs.n_tokens > st.engine.max_context:
            raise InvalidRequestError(
                f"a {cs.kind} segment has {cs.n_tokens} tokens, over the context window ({st.engine.max_context})",
                param="segments",
            )
        out.append(cs)
    return out


def put_segments(st: ServerState, req: PutSegmentsRequest, tenant: str) -> dict[str, Any]:
    mode, seam, key_seam = resolve_mode(st, req.mode, req.seam)
    if seam in ("auto", "blend"):
        raise InvalidRequestError(
            f'seam "{seam}" picks widths per request; pre-warm with a fixed seam ({seam} shares its entries)',
            param="seam",
        )
    if not mode_spec(mode).composed:
        raise InvalidRequestError(
            f"mode {mode!r} keeps no segment entries; pre-warm for a composed mode such as 'hypic'", param="mode"
        )
    segs = canonical_segments(st, req, tenant, key_seam)
    min_tokens = st.settings.min_cached_tokens
    warm = [s for s in segs if s.n_tokens >= min_tokens and seam_tokens(key_seam, s.n_tokens) < s.n_tokens]
    hints = {str(s.key): EntryHint(s.text, s.title, s.cache.pin, s.cache.ttl, dict(s.metadata)) for s in segs}
    hit: dict[str, bool] = {}
    refused: Exception | None = None
    if any(s.cache.pin for s in warm):
        st.store.check_pin_room(tenant)  # no quota left: 409 before computing anything
    st.admit_put(warm, mode, float(seam), tenant)  # over the stored-bytes caps: 413 / 429 before anything is built
    if warm:  # between scheduler steps, with the registry hints held while the entries are stored
        tokens, kinds = [s.token_ids for s in warm], [s.kind for s in warm]
        usage = st.prewarm(tokens, kinds, tenant=tenant, mode=mode, seam=seam, hints=hints)
        hit = {u.id: u.hit for u in usage if u.id is not None}
    for s in segs:
        meta = EntryMeta.for_segment(s, tenant=tenant, model_fingerprint=st.engine.fingerprint)
        rec = st.store.info(s.key, tenant)
        if rec is None:  # too short to cache, or fit no budget
            st.store.register(s.key, meta)
        elif (hit.get(s.key) or (s.cache.pin and not rec.pinned)) and (s.cache.pin or s.cache.ttl is not None):
            kwargs: dict[str, Any] = {"pinned": True} if s.cache.pin else {}
            if s.cache.ttl is not None:
                kwargs["ttl_s"] = s.cache.ttl
            try:  # a pin the store refused (over the tenant's quota) says why here
                st.store.set_policy(s.key, tenant, **kwargs)
            except (PinQuotaError, EntryTooLargeError) as exc:
                refused = refused or exc
    if refused is not None:
        raise refused  # the entries are stored, unpinned
    data = []
    for s in segs:
        rec = st.store.info(s.key, tenant)
        assert rec is not None
        data.append(info_of(rec, hit=hit.get(s.key, False)).model_dump())
    return {"object": "list", "data": data}


def get_segment(st: ServerState, segment_id: str, tenant: str) -> dict[str, Any]:
    rec = st.store.info(segment_id, tenant)
    if rec is None:
        raise _not_found(segment_id)
    return info_of(rec, with_text=True).model_dump()


def list_segments(st: ServerState, tenant: str, limit: int, after: str | None, kind: str | None) -> dict[str, Any]:
    page = st.store.list_entries(tenant, limit=limit, cursor=after, kind=kind)
    data: list[SegmentInfo] = []
    for r in page.items:  # the store repairs damaged rows; one that still cannot be shown is left out
        try:
            data.append(info_of(r))
        except ValidationError as exc:
            log.warning("segment %s left out of the listing: its registry row does not validate (%s)", r.key, exc)
    return SegmentList(data=data, has_more=page.next_cursor is not None, next=page.next_cursor).model_dump()


def delete_segment(st: ServerState, segment_id: str, tenant: str) -> dict[str, Any]:
    if not st.store.delete(segment_id, tenant):
        raise _not_found(segment_id)
    return {"id": segment_id, "object": "segment", "deleted": True}


def patch_segment(st: ServerState, segment_id: str, req: PatchSegmentRequest, tenant: str) -> dict[str, Any]:
    given = req.cache.model_fields_set
    if not given:
        raise InvalidRequestError("give cache.pin and/or cache.ttl to change", param="cache")
    kwargs: dict[str, Any] = {}
    if "pin" in given and req.cache.pin is not None:
        kwargs["pinned"] = req.cache.pin
    if "ttl" in given:
        kwargs["ttl_s"] = req.cache.ttl  # null clears the TTL
    rec = st.store.set_policy(segment_id, tenant, **kwargs)
    if rec is None:
        raise _not_found(segment_id)
    return info_of(rec).model_dump()
