"""Segments: building prompts from them (``prompt/``) and storing what is computed for them (``store/``).

``prompt/``: ``SegmentIn`` (wire) -> ``Segment`` -> ``CanonicalSegment`` (framed, tokenized,
keyed) -> ``PromptPlan``; pure, no torch. ``store/``: entries computed for segments live in the
``SegmentStore`` (GPU -> CPU -> disk, rows in the SQLAlchemy ``Registry``); it builds on
``prompt/``, never the other way round.

Names resolve lazily, so importing e.g. ``hypic_agent.segments.prompt.kinds`` does not pull in torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "prompt.kinds": ("KINDS", "CachePolicy", "Message", "Segment", "SegmentIn", "SegmentKind", "parse_segment"),
    "prompt.framing": ("FORMAT_VERSION", "Framer"),
    "prompt.keys": ("KeyContext", "SegmentKey", "segment_key", "token_digest"),
    "prompt.tokenize": ("CanonicalSegment", "Tokenizer", "canonicalize"),
    "prompt.plan": ("PromptPlan", "Resolver", "build_plan"),
    "prompt.resolve": ("stored_resolver",),
    "store.record": ("EntryRecord", "Page"),
    "store.registry": ("Registry",),
    "store.entries": ("EntryMeta", "Fetch", "StoreStats", "TierStats"),
    "store.eviction": ("EvictionPolicy",),
    "store.segment_store": ("SegmentStore",),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = [
    "FORMAT_VERSION",
    "KINDS",
    "CachePolicy",
    "CanonicalSegment",
    "EntryMeta",
    "EntryRecord",
    "EvictionPolicy",
    "Fetch",
    "Framer",
    "KeyContext",
    "Message",
    "Page",
    "PromptPlan",
    "Registry",
    "Resolver",
    "Segment",
    "SegmentIn",
    "SegmentKey",
    "SegmentKind",
    "SegmentStore",
    "StoreStats",
    "TierStats",
    "Tokenizer",
    "build_plan",
    "canonicalize",
    "parse_segment",
    "segment_key",
    "stored_resolver",
    "token_digest",
]

if TYPE_CHECKING:
    from hypic_agent.segments.prompt.framing import FORMAT_VERSION, Framer
    from hypic_agent.segments.prompt.keys import KeyContext, SegmentKey, segment_key, token_digest
    from hypic_agent.segments.prompt.kinds import (
        KINDS,
        CachePolicy,
        Message,
        Segment,
        SegmentIn,
        SegmentKind,
        parse_segment,
    )
    from hypic_agent.segments.prompt.plan import PromptPlan, Resolver, build_plan
    from hypic_agent.segments.prompt.resolve import stored_resolver
    from hypic_agent.segments.prompt.tokenize import CanonicalSegment, Tokenizer, canonicalize
    from hypic_agent.segments.store.entries import EntryMeta, Fetch, StoreStats, TierStats
    from hypic_agent.segments.store.eviction import EvictionPolicy
    from hypic_agent.segments.store.record import EntryRecord, Page
    from hypic_agent.segments.store.registry import Registry
    from hypic_agent.segments.store.segment_store import SegmentStore


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'hypic_agent.segments' has no attribute {name!r}")
    value = getattr(import_module(f"hypic_agent.segments.{module}"), name)
    globals()[name] = value
    return value
