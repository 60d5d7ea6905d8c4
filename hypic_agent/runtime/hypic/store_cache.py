"""``StoreEntryCache``: the engine's ``EntryCache`` over the persistent tiered ``SegmentStore``.

Entries survive restarts (the store writes every entry through to disk) and a hit reports the
tier it was served from (``gpu`` | ``cpu`` | ``disk``). Keys are the engine's content keys
(``xxh3_128`` over format version, model fingerprint, tenant, seam, token ids), so they are
tenant-salted: one tenant can never look up another tenant's entry.

The engine's ``insert`` only knows the key, the entry, its kind and tenant; what the API knows
besides (framed text, title, metadata, pin / TTL) is handed over beforehand with ``describe``
and folded into the registry row when the entry is stored.

NOTE: a payload whose model fingerprint differs from this cache's, or that does not decode into
a ``SegmentEntry`` of this model's layer layout, is dropped and reported as a miss (it is then
recomputed), never served.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from hypic_agent.runtime.hypic.cache import Lookup
from hypic_agent.runtime.hypic.entry import SegmentEntry
from hypic_agent.segments.store.entries import EntryMeta
from hypic_agent.segments.store.segment_store import SegmentStore

log = logging.getLogger("hypic.store_cache")


@dataclass(frozen=True)
class EntryHint:
    """What the caller knows about a segment the engine may store under ``key``."""

    text: str | None = None
    title: str | None = None
    pinned: bool = False
    ttl_s: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


class StoreEntryCache:
    """``EntryCache`` (``lookup`` / ``insert``) backed by a ``SegmentStore``. Thread-safe."""

    def __init__(self, store: SegmentStore, layer_kinds: Iterable[str], fingerprint: str) -> None:
        self.store = store
        self.layer_kinds = tuple(layer_kinds)
        self.fingerprint = fingerprint
        self._hints: dict[str, EntryHint] = {}
        self._holders: Counter[str] = Counter()  # requests currently holding a hint per key
        self._lock = threading.Lock()
        self.inserts: Counter[str] = Counter()  # key -> times stored (a cold prefill each)
        self.hits = 0
        self.misses = 0
        self.on_insert: Callable[[str], None] | None = None  # e.g. a metrics hook, called per cold store

    # ------------------------------------------------------------------ EntryCache
    def lookup(self, key: str, *, count: bool = True) -> Lookup:
        """``count=False``: a re-read of an entry this request already looked up (its admission
        counted the use), so the store's hits and this cache's counts are one per request."""
        hit = self.store.get(key, model_fingerprint=self.fingerprint, count=count)
        if hit is None:
            if count:
                self._count(hit=False)
            return Lookup(None, None)
        tensors, tier = hit
        try:
            entry = SegmentEntry.from_tensors(tensors, self.layer_kinds)
        except (KeyError, IndexError, ValueError, RuntimeError) as exc:
            log.warning("entry %s does not decode for this model (%s); dropping its payload", key, exc)
            self.store.drop_payload(key)  # the row (and the id) stays; rebuilt on next use
            if count:
                self._count(hit=False)
            return Lookup(None, None)
        if count:
            self._count(hit=True)
        return Lookup(entry, tier)

    def insert(self, key: str, entry: SegmentEntry, *, kind: str = "text", tenant: str = "default") -> None:
        with self._lock:
            hint = self._hints.get(key)
            self.inserts[key] += 1
        if hint is None:
            hint = self._hint_from_registry(key, tenant)
        meta = EntryMeta(
            tenant=tenant,
            kind=kind,
            n_tokens=entry.n_tokens,
            model_fingerprint=self.fingerprint,
            prefill_ms=entry.prefill_ms,
            pinned=hint.pinned,
            ttl_s=hint.ttl_s,
            token_ids=tuple(entry.token_ids),
            text=hint.text,
            title=hint.title,
            extra=dict(hint.extra),
        )
        tier = self.store.put(key, entry.to_tensors(), meta)
        if self.on_insert is not None:
            self.on_insert(key)
        if tier is None:
            log.info("entry %s (%d bytes) fits no tier budget; not stored", key, entry.nbytes())

    # ------------------------------------------------------------------ hints
    @contextmanager
    def described(self, hints: Mapping[str, EntryHint]) -> Iterator[None]:
        """Hints that hold for the duration of one request (dropped once no request holds them)."""
        with self._lock:
            for k, h in hints.items():
                self._hints[k] = h
                self._holders[k] += 1
        try:
            yield
        finally:
            with self._lock:
                for k in hints:
                    self._holders[k] -= 1
                    if self._holders[k] <= 0:
                        del self._holders[k]
                        self._hints.pop(k, None)

    def pending_hints(self) -> int:
        with self._lock:
            return len(self._hints)

    # ------------------------------------------------------------------ helpers
    def _hint_from_registry(self, key: str, tenant: str) -> EntryHint:
        """Keep what an existing row (e.g. a registered definition) already says."""
        rec = self.store.info(key, tenant)
        if rec is None:
            return EntryHint()
        return EntryHint(text=rec.text, title=rec.title, pinned=rec.pinned, ttl_s=rec.ttl_s, extra=dict(rec.meta))

    def _count(self, *, hit: bool) -> None:
        with self._lock:
            if hit:
                self.hits += 1
            else:
                self.misses += 1
