"""The store's small objects: what a caller says about an entry (``EntryMeta``), the store's
live index record (``IndexEntry``), a lookup result (``Fetch``) and ``StoreStats``."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from hypic_agent.errors import InvalidRequestError
from hypic_agent.segments.prompt.keys import token_digest
from hypic_agent.segments.prompt.tokenize import CanonicalSegment
from hypic_agent.segments.store.record import EntryRecord, State, Tier

Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class EntryMeta:
    """Caller-side facts about an entry, given to ``SegmentStore.put`` / ``register``.

    ``prefill_ms`` is what recomputing it costs (the eviction policy weighs it against its
    bytes). ``token_ids`` / ``text`` are kept in the registry so a stored id can be resolved
    and recomputed later; ``token_digest`` defaults to the digest of ``token_ids``.
    """

    tenant: str
    kind: str
    n_tokens: int
    model_fingerprint: str
    prefill_ms: float = 0.0
    pinned: bool = False
    ttl_s: float | None = None
    token_ids: tuple[int, ...] | None = None
    token_digest: str | None = None
    text: str | None = None
    title: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.ttl_s is not None and not 0 < self.ttl_s < math.inf:
            raise InvalidRequestError(f"ttl must be a finite number > 0 seconds, got {self.ttl_s}", param="cache.ttl")
        if self.token_ids is not None and self.token_digest is None:
            object.__setattr__(self, "token_digest", token_digest(self.token_ids))

    @classmethod
    def for_segment(
        cls, seg: CanonicalSegment, *, tenant: str, model_fingerprint: str, prefill_ms: float = 0.0
    ) -> EntryMeta:
        return cls(
            tenant=tenant,
            kind=seg.kind,
            n_tokens=seg.n_tokens,
            model_fingerprint=model_fingerprint,
            prefill_ms=prefill_ms,
            pinned=seg.cache.pin,
            ttl_s=seg.cache.ttl,
            token_ids=seg.token_ids,
            text=seg.text,
            title=seg.title,
            extra=dict(seg.metadata),
        )


@dataclass(slots=True)
class IndexEntry:
    """The store's live view of one entry (mutated only under the store lock).

    ``mem_tier`` is the memory tier holding the payload (GPU and CPU are exclusive);
    ``location`` the disk file (write-through, so usually set as well).
    """

    key: str
    tenant: str
    kind: str
    n_tokens: int
    model_fingerprint: str
    nbytes: int
    prefill_ms: float
    created_at: float
    last_used_at: float
    hits: int = 0
    pinned: bool = False
    ttl_s: float | None = None
    token_digest: str | None = None
    mem_tier: str | None = None
    location: str | None = None
    checksum: str | None = None
    file_bytes: int = 0
    state: State = "ready"
    has_payload: bool = True

    @property
    def tier(self) -> Tier:
        if self.mem_tier is not None:
            return self.mem_tier  # type: ignore[return-value]
        return "disk" if self.location is not None else "none"

    @property
    def expires_at(self) -> float | None:
        return None if self.ttl_s is None else self.last_used_at + self.ttl_s

    def expired(self, now: float) -> bool:
        exp = self.expires_at
        return exp is not None and exp <= now

    def to_record(self, meta: EntryMeta | None = None) -> EntryRecord:
        return EntryRecord(
            key=self.key,
            tenant=self.tenant,
            kind=self.kind,
            n_tokens=self.n_tokens,
            model_fingerprint=self.model_fingerprint,
            created_at=self.created_at,
            last_used_at=self.last_used_at,
            nbytes=self.nbytes,
            tier=self.tier,
            location=self.location,
            checksum=self.checksum,
            hits=self.hits,
            pinned=self.pinned,
            ttl_s=self.ttl_s,
            prefill_ms=self.prefill_ms,
            state=self.state,
            token_digest=self.token_digest,
            token_ids=meta.token_ids if meta else None,
            text=meta.text if meta else None,
            title=meta.title if meta else None,
            meta=dict(meta.extra) if meta else {},
        )

    @classmethod
    def from_record(cls, rec: EntryRecord, *, file_bytes: int = 0) -> IndexEntry:
        return cls(
            key=rec.key,
            tenant=rec.tenant,
            kind=rec.kind,
            n_tokens=rec.n_tokens,
            model_fingerprint=rec.model_fingerprint,
            nbytes=rec.nbytes,
            prefill_ms=rec.prefill_ms,
            created_at=rec.created_at,
            last_used_at=rec.last_used_at,
            hits=rec.hits,
            pinned=rec.pinned,
            ttl_s=rec.ttl_s,
            token_digest=rec.token_digest,
            location=rec.location,
            checksum=rec.checksum,
            file_bytes=file_bytes,
            state=rec.state,
            has_payload=rec.location is not None,
        )


@dataclass(frozen=True)
class Fetch:
    """Result of ``get_or_compute``: ``tier`` it was served from (``None``: computed now),
    ``computed``: the flight this call joined ran the computation, ``waited``: this call
    joined a flight another caller led."""

    tensors: Tensors
    tier: str | None
    computed: bool
    waited: bool = False


@dataclass(frozen=True)
class TierStats:
    bytes: int
    budget: int
    entries: int
    evictions: int
    enabled: bool


@dataclass(frozen=True)
class StoreStats:
    tiers: dict[str, TierStats]
    entries: int
    hits: int
    misses: int
    evicted: int  # entries that left the store entirely for lack of space
    expired: int
    corrupt: int  # disk entries that failed checksum / format checks (dropped)
    rejected: int  # foreign fingerprint or token digest mismatch (dropped)
    in_flight: int

    def bytes_per_tier(self) -> dict[str, int]:
        return {name: t.bytes for name, t in self.tiers.items()}
