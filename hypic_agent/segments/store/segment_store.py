"""``SegmentStore``: the tiered, persistent, thread-safe store of segment entries.

Payloads are opaque ``dict[str, Tensor]`` (the runtime defines them). Tiers, fastest first:
GPU pool (only with CUDA, or an explicit ``gpu_device``) -> CPU (pinned when CUDA is there)
-> disk (one safetensors file per entry). GPU and CPU hold an entry exclusively; the disk is
written through on ``put``, so every entry that fits the disk budget survives a restart.

* hit: served from the tier it is in and promoted to the top memory tier;
* budgets: a tier over budget sheds its lowest-score entries (``eviction.py``): GPU -> CPU,
  CPU -> dropped from memory (still on disk), disk -> file removed; an entry left nowhere keeps
  its registry row (``tier = none``: tokens, text, policy and hits stay, the id still resolves
  and the next request that uses it rebuilds the payload). Pinned entries are never shed; a
  TTL still ends them (row and all);
* tenants (``quota.py``): a tenant's pinned bytes stay within its share of each tier, and
  one tenant's entries never push another tenant's below its reserved share;
* safety: a disk entry whose checksum, format, key or model fingerprint does not check out is
  dropped to ``tier = none`` the same way and its file quarantined (``<store>/quarantine/``),
  unless its own header proves the file intact and the row's checksum wrong (then the row is
  fixed); a hit whose fingerprint / token digest differs from what the caller expects is
  deleted with its row. Neither is ever served;
* damage: ``open()`` rebuilds rows from the payload files' headers when the registry lost them
  and repairs rows whose values do not decode (``recovery.py``); a damaged row met later
  (``info``, ``list_entries``, ``set_policy``) is repaired the same way, never raised.

NOTE: one store object owns one store dir; registry rows are the source of truth for what is
on disk, and ``open()`` makes the two consistent after a crash (``recovery.py``).
``put`` takes ownership of the tensors it is given (a memory tier on their device keeps them
as they are, without a copy) and returned tensors are shared with the store: treat both as
read-only. One store object per store dir and process (no cross-process locking).

Composition: the store holds one lock, the live index (``IndexEntry`` per key, shared by
reference with the collaborators) and keeps three things in step: the tiers' contents, the index
and the registry rows. Its collaborators each do one part, under its lock:

* ``registry`` (``registry.py``): the rows, the source of truth for what is on disk;
* ``tiers`` (``tiers.py``): GPU -> CPU -> disk, placement / promotion / demotion;
* ``quota`` (``quota.py``): tenants' pin quotas and reserves;
* ``eviction`` (``eviction.py``): sheds entries until every tier is within budget;
* ``usage`` (``usage.py``): hit / miss counters, buffered touches, ``stats()``;
* ``flights`` (``flights.py``): ``get_or_compute``, one computation per key at a time;
* ``recover`` / ``repair_row`` (``recovery.py``): ``open()`` and repairs of damaged rows met
  later; ``recovery`` keeps the last ``RecoveryReport``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hypic_agent.config import Settings
from hypic_agent.errors import InvalidRequestError
from hypic_agent.segments.prompt.keys import token_digest
from hypic_agent.segments.store.disk_tier import CorruptEntryError, DiskTier
from hypic_agent.segments.store.entries import EntryMeta, Fetch, IndexEntry, StoreStats, Tensors
from hypic_agent.segments.store.eviction import Eviction, EvictionPolicy
from hypic_agent.segments.store.flights import AsyncCompute, Compute, StoreFlights
from hypic_agent.segments.store.headers import record_from_header, row_header
from hypic_agent.segments.store.memory_tier import MemoryTier, payload_nbytes
from hypic_agent.segments.store.quota import TenantQuota, TenantShares
from hypic_agent.segments.store.record import UNSET, EntryRecord, Page
from hypic_agent.segments.store.recovery import RecoveryReport, recover, repair_row
from hypic_agent.segments.store.registry import Registry
from hypic_agent.segments.store.tiers import Tiers
from hypic_agent.segments.store.usage import UsageLog

log = logging.getLogger(__name__)


class SegmentStore:
    def __init__(
        self,
        registry: Registry,
        root: Path | str,
        *,
        gpu_budget_bytes: int = 0,
        cpu_budget_bytes: int = 1 << 30,
        disk_budget_bytes: int = 8 << 30,
        gpu_device: str | torch.device | None = "auto",
        pin_cpu: bool | None = None,
        policy: EvictionPolicy | None = None,
        default_ttl_s: float | None = None,
        flush_interval_s: float = 2.0,
        clock: Callable[[], float] = time.time,
        owns_registry: bool = False,
        shares: TenantShares | None = None,
    ) -> None:
        cuda = torch.cuda.is_available()
        if gpu_device == "auto":
            gpu_device = "cuda" if cuda else None
        gpu = MemoryTier("gpu", gpu_device or "cpu", gpu_budget_bytes if gpu_device else 0)
        cpu = MemoryTier("cpu", "cpu", cpu_budget_bytes, pin=cuda if pin_cpu is None else pin_cpu)
        disk = DiskTier(root, disk_budget_bytes)
        self.registry = registry
        self.default_ttl_s = default_ttl_s
        self.clock = clock
        self._owns_registry = owns_registry
        self._lock = threading.RLock()
        self._index: dict[str, IndexEntry] = {}
        self.quota = TenantQuota(shares or TenantShares(), gpu, cpu, disk, self._index)
        self.tiers = Tiers(gpu, cpu, disk, self.quota, self._index)
        self.usage = UsageLog(registry, clock, flush_interval_s)
        self.eviction = Eviction(policy or EvictionPolicy(), self.tiers, self.quota, self.usage, self._index)
        self.flights = StoreFlights(self.get, self.put)
        self.recovery = RecoveryReport()
        self._opened = False
        self._last_expire = 0.0

    # the collaborators' parts that callers read (``store.disk.path(...)``, ``store.shares``)
    @property
    def gpu(self) -> MemoryTier:
        return self.tiers.gpu

    @property
    def cpu(self) -> MemoryTier:
        return self.tiers.cpu

    @property
    def disk(self) -> DiskTier:
        return self.tiers.disk

    @property
    def shares(self) -> TenantShares:
        return self.quota.shares

    @property
    def policy(self) -> EvictionPolicy:
        return self.eviction.policy

    @property
    def flush_interval_s(self) -> float:
        return self.usage.flush_interval_s

    @classmethod
    def from_settings(cls, settings: Settings, registry: Registry | None = None, **kwargs: Any) -> SegmentStore:
        """Store over ``settings`` (budgets, dirs, database URL), already ``open()``."""
        owns = registry is None
        device: str | None = settings.device if settings.device.startswith("cuda") else "auto"
        if settings.device == "cpu":
            device = None
        store = cls(
            registry or Registry.from_settings(settings),
            settings.resolved_store_dir(),
            gpu_budget_bytes=settings.gpu_budget_bytes,
            cpu_budget_bytes=settings.cpu_budget_bytes,
            disk_budget_bytes=settings.disk_budget_bytes,
            gpu_device=kwargs.pop("gpu_device", device),
            default_ttl_s=settings.default_ttl_s,
            flush_interval_s=kwargs.pop("flush_interval_s", settings.hit_flush_interval_s),
            owns_registry=owns,
            shares=kwargs.pop("shares", TenantShares.from_settings(settings)),
            **kwargs,
        )
        return store.open()

    # ------------------------------------------------------------------ lifecycle
    def open(self) -> SegmentStore:
        """Recover after a crash or restart: drop half-written entries and orphan files."""
        with self._lock:
            if not self._opened:
                self.recovery = recover(self.registry, self.disk, self.clock())
                self._index.clear()  # shared with the collaborators: filled in place
                self._index.update((e.key, e) for e in self.recovery.entries)
                self.disk.used = sum(e.file_bytes for e in self._index.values() if e.location)
                self._enforce_locked(set(), self.clock())
                self._opened = True
        return self

    def close(self) -> None:
        with self._lock:
            self.usage.flush()
            if self._owns_registry:
                self.registry.close()

    def __enter__(self) -> SegmentStore:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ put
    def put(self, key: str, tensors: Tensors, meta: EntryMeta) -> str | None:
        """Store a payload (replacing any under ``key``); returns the memory tier it landed in,
        ``"disk"``, or ``None`` when it fits no budget (then no payload is stored; a row that
        was there stays, ``tier = none``).

        Replacing keeps the old entry's ``created_at``, hit count, pin and TTL unless ``meta``
        pins it or sets a TTL. A pin over the tenant's quota is not applied (the entry is stored
        unpinned; ``set_policy`` says why). The disk copy is written before this returns (outside
        the lock)."""
        if not tensors or not all(isinstance(t, torch.Tensor) for t in tensors.values()):
            raise InvalidRequestError("an entry payload must be a non-empty dict of tensors", param="tensors")
        nbytes = payload_nbytes(tensors)
        now = self.clock()
        with self._lock:
            self._require_open()
            old = self._index.get(key)
            entry = IndexEntry(
                key=key, tenant=meta.tenant, kind=meta.kind, n_tokens=meta.n_tokens,
                model_fingerprint=meta.model_fingerprint, nbytes=nbytes, prefill_ms=meta.prefill_ms,
                created_at=old.created_at if old else now, last_used_at=now, hits=old.hits if old else 0,
                pinned=meta.pinned or bool(old and old.pinned),
                ttl_s=meta.ttl_s if meta.ttl_s is not None else (old.ttl_s if old else self.default_ttl_s),
                token_digest=meta.token_digest,
            )  # fmt: skip
            if old is not None:
                self.tiers.discard(old)
            refused = self.quota.pin_error(entry, nbytes) if entry.pinned else None
            if refused is not None:
                log.warning("entry %s stored unpinned: %s", key, refused)
                entry.pinned = False
            placed = self.tiers.place(entry, tensors)
            to_disk = self.disk.fits(nbytes)
            if placed is None and not to_disk:
                if old is not None:
                    self._drop_payload_locked(old)
                return None
            entry.state = "writing" if to_disk else "ready"
            self._index[key] = entry
            self.registry.upsert(entry.to_record(meta))
            self._enforce_locked({key}, now)
            self._maybe_expire_locked(now)
        if not to_disk:
            return entry.mem_tier
        return self._write_through(entry, tensors, meta) or entry.mem_tier

    def register(self, key: str, meta: EntryMeta) -> EntryRecord:
        """Record a segment definition (tokens, policy) without a payload, e.g. one too short
        to cache; an existing entry only gets its policy updated."""
        now = self.clock()
        with self._lock:
            self._require_open()
            if key in self._index:
                rec = self.set_policy(key, pinned=meta.pinned or None, ttl_s=meta.ttl_s or UNSET)
                assert rec is not None
                return rec
            entry = IndexEntry(
                key=key, tenant=meta.tenant, kind=meta.kind, n_tokens=meta.n_tokens,
                model_fingerprint=meta.model_fingerprint, nbytes=0, prefill_ms=meta.prefill_ms,
                created_at=now, last_used_at=now, pinned=meta.pinned,
                ttl_s=meta.ttl_s if meta.ttl_s is not None else self.default_ttl_s,
                token_digest=meta.token_digest, has_payload=False,
            )  # fmt: skip
            self._index[key] = entry
            return self.registry.upsert(entry.to_record(meta))

    # ------------------------------------------------------------------ get
    def get(
        self,
        key: str,
        *,
        tenant: str | None = None,
        model_fingerprint: str | None = None,
        token_digest: str | None = None,
        count: bool = True,
    ) -> tuple[Tensors, str] | None:
        """The payload of ``key`` and the tier it was found in, or ``None`` (miss).

        ``tenant`` / ``model_fingerprint`` / ``token_digest``, when given, must match the
        entry; a fingerprint or digest mismatch deletes the entry. ``count=False``: a re-read
        of an entry already counted for this use (e.g. by the same request at its admission):
        no hit or miss is counted and its hits and last-used time stay as they are."""
        now = self.clock()
        with self._lock:
            self._require_open()
            e = self._index.get(key)
            if e is None or (tenant is not None and e.tenant != tenant) or not e.has_payload:
                return self._miss(count)
            if (model_fingerprint is not None and e.model_fingerprint != model_fingerprint) or (
                token_digest is not None and e.token_digest != token_digest
            ):
                self.usage.count("rejected")
                self._forget_locked(key)
                return self._miss(count)
            if e.expired(now):
                self.usage.count("expired")
                self._forget_locked(key)
                return self._miss(count)
            if e.mem_tier is not None:
                found = e.mem_tier
                tensors = self._promote_locked(e, now)
                return self._hit_locked(e, now, tensors, found, count)
            if e.location is None or e.state != "ready":
                return self._miss(count)
            location, checksum = e.location, e.checksum
        try:  # disk read + verification outside the lock
            tensors, _ = self._read_checked(e, location, checksum)
        except CorruptEntryError as exc:
            with self._lock:
                if self._index.get(key) is e and e.location == location:
                    self.usage.count("corrupt")
                    moved = self.disk.quarantine(location)
                    log.warning(
                        "dropping the payload of entry %s (its row stays, rebuilt on next use): %s; file quarantined "
                        "to %s", key, exc, moved,
                    )  # fmt: skip
                    self._drop_payload_locked(e)
                return self._miss(count)
        with self._lock:
            if self._index.get(key) is not e or e.location != location:
                return self._miss(count)  # deleted or replaced while we read
            held = self.tiers.place(e, tensors) if e.mem_tier is None else self.tiers.memory(e.mem_tier).get(key)
            self._settle_locked(e)
            self._enforce_locked({key}, now)
            return self._hit_locked(e, now, held if held is not None else tensors, "disk", count)

    def _read_checked(self, e: IndexEntry, location: str, checksum: str | None) -> tuple[Tensors, dict[str, str]]:
        """Read ``e``'s file; a checksum that does not match is checked once more against the file's
        own header (the row's checksum may be what is damaged: then the row is corrected)."""
        try:
            tensors, md = self.disk.read(location, checksum)
        except CorruptEntryError as exc:
            if "checksum mismatch" not in str(exc):
                raise
            h = self.disk.inspect(location)  # raises CorruptEntryError for a damaged file
            rec = record_from_header(h, self.clock())
            if not h.verified or (rec.key, rec.model_fingerprint, rec.token_digest) != (
                e.key, e.model_fingerprint, e.token_digest
            ):  # fmt: skip
                raise
            tensors, md = self.disk.read(location, h.checksum)
            with self._lock:
                if self._index.get(e.key) is e and e.location == location:
                    log.warning("entry %s: its row's checksum did not match its intact file; row corrected", e.key)
                    e.checksum = h.checksum
                    self.registry.set_location(e.key, tier=e.tier, checksum=h.checksum)
        if md.get("key") != e.key or md.get("model_fingerprint") != e.model_fingerprint:
            raise CorruptEntryError(f"{location} belongs to another key or model")
        return tensors, md

    def contains(self, key: str) -> bool:
        with self._lock:
            e = self._index.get(key)
            return e is not None and e.has_payload and (e.mem_tier is not None or e.location is not None)

    # ------------------------------------------------------------------ admin
    def drop_payload(self, key: str) -> bool:
        """Forget ``key``'s payload (e.g. it does not decode for this model); its row stays, as tier
        none, and the next request that uses it rebuilds the payload."""
        with self._lock:
            e = self._index.get(key)
            if e is None:
                return False
            self._drop_payload_locked(e)
            return True

    def delete(self, key: str, tenant: str | None = None) -> bool:
        with self._lock:
            e = self._index.get(key)
            if e is None or (tenant is not None and e.tenant != tenant):
                return False
            self._forget_locked(key)
            return True

    def set_policy(
        self, key: str, tenant: str | None = None, *, pinned: bool | None = None, ttl_s: Any = UNSET
    ) -> EntryRecord | None:
        """Pin / unpin and set or clear (``ttl_s=None``) the sliding TTL. Pinning over the tenant's
        quota raises ``quota.PinQuotaError`` (409) or ``quota.EntryTooLargeError`` (413)."""
        with self._lock:
            e = self._index.get(key)
            if e is None or (tenant is not None and e.tenant != tenant):
                return None
            if pinned and not e.pinned and e.nbytes:  # an entry without payload: the bytes its rebuild takes
                refused = self.quota.pin_error(e, e.nbytes)
                if refused is not None:
                    raise refused
            self.usage.flush()
            rec = self.registry.set_policy(key, pinned=pinned, ttl_s=ttl_s)
            if rec is not None and rec.damaged:
                rec = self._repaired_locked(rec)
            if pinned is not None:
                e.pinned = pinned
            if ttl_s is not UNSET:
                e.ttl_s = ttl_s
            if pinned is False:
                self._enforce_locked(set(), self.clock(), actors={e.tenant})
            return rec

    def info(self, key: str, tenant: str | None = None) -> EntryRecord | None:
        """The registry row (with token ids and text) of ``key``."""
        with self._lock:
            self.usage.flush()
            rec = self.registry.get(key, tenant)
            return self._repaired_locked(rec) if rec is not None else None

    def list_entries(self, tenant: str, *, limit: int = 50, cursor: str | None = None, kind: str | None = None) -> Page:
        """A tenant's rows, newest first; a row with values that do not decode is repaired (or shown
        with safe defaults), never fails the page."""
        with self._lock:
            self.usage.flush()
        page = self.registry.list_entries(tenant, limit=limit, cursor=cursor, kind=kind)
        if not any(r.damaged for r in page.items):
            return page
        with self._lock:
            items = [self._repaired_listed_locked(r) if r.damaged else r for r in page.items]
        return Page(items=items, next_cursor=page.next_cursor)

    def expire(self, now: float | None = None) -> int:
        """Drop every entry whose TTL ran out; returns how many."""
        now = self.clock() if now is None else now
        with self._lock:
            dead = [k for k, e in self._index.items() if e.expired(now)]
            for k in dead:
                self._forget_locked(k)
            self.usage.count("expired", len(dead))
            return len(dead)

    def flush(self) -> None:
        """Write buffered hit counts / last-used times to the registry."""
        with self._lock:
            self.usage.flush()

    def stats(self) -> StoreStats:
        with self._lock:
            return self.usage.stats(self.tiers, self._index, self.flights.in_flight())

    def check_pin_room(self, tenant: str) -> None:
        """Raise ``quota.PinQuotaError`` when ``tenant`` has no pin quota left at all (checked before
        computing entries that are to be pinned)."""
        with self._lock:
            self.quota.check_pin_room(tenant)

    def get_or_compute(self, key: str, compute: Compute, **check: Any) -> Fetch:
        """``get``, or run ``compute() -> (tensors, meta)`` once however many threads ask at once."""
        return self.flights.get_or_compute(key, compute, **check)

    async def aget_or_compute(self, key: str, compute: AsyncCompute, **check: Any) -> Fetch:
        """Async twin: waiting never blocks the event loop; ``compute`` may be sync (run in a
        thread) or async. Shares flights with ``get_or_compute``."""
        return await self.flights.aget_or_compute(key, compute, **check)

    # ------------------------------------------------------------------ keeping tiers, index and rows in step
    def _miss(self, count: bool = True) -> tuple[Tensors, str] | None:
        self.usage.miss(count)
        return None

    def _hit_locked(
        self, e: IndexEntry, now: float, tensors: Tensors, found: str, count: bool = True
    ) -> tuple[Tensors, str]:
        self.usage.hit(e, now, count)
        return tensors, found

    def _promote_locked(self, e: IndexEntry, now: float) -> Tensors:
        """Move a CPU-resident payload up to the GPU pool (if it has room); return the held tensors."""
        held, moved = self.tiers.promote(e)
        if moved:
            self._settle_locked(e)
            self._enforce_locked({e.key}, now)
        return held

    def _enforce_locked(self, protect: set[str], now: float, actors: set[str] | None = None) -> None:
        """Bring every tier within budget (``Eviction.enforce``), then record where each entry it
        moved lives now."""
        for e in self.eviction.enforce(protect, now, actors):
            self._settle_locked(e)

    def _settle_locked(self, e: IndexEntry) -> None:
        """Record where ``e`` now lives; an entry left in no tier keeps its row (``tier = none``)."""
        if e.has_payload and e.mem_tier is None and e.location is None and e.state != "writing":
            self.usage.count("evicted")
            self._drop_payload_locked(e)
        else:
            self.registry.set_location(e.key, tier=e.tier, location=e.location, checksum=e.checksum)

    def _write_through(self, entry: IndexEntry, tensors: Tensors, meta: EntryMeta) -> str | None:
        """Write the disk copy outside the lock, then publish it if the entry is still current."""
        md = row_header(entry, meta)  # the file describes its row: a lost registry is rebuilt from it
        try:
            written = self.disk.write(entry.key, tensors, md)
        except OSError as exc:
            log.warning("disk write of entry %s failed: %s", entry.key, exc)
            with self._lock:
                if self._index.get(entry.key) is entry:
                    entry.state = "ready"
                    self._settle_locked(entry)
            return None
        with self._lock:
            if self._index.get(entry.key) is not entry:  # deleted or replaced meanwhile
                self.disk.remove(written.location)
                return None
            entry.location, entry.checksum, entry.file_bytes = written.location, written.checksum, written.file_bytes
            entry.state = "ready"
            self.disk.used += written.file_bytes
            if entry.pinned and (refused := self.quota.pin_error(entry, entry.nbytes)) is not None:
                log.warning("entry %s unpinned: its file came out larger than estimated: %s", entry.key, refused)
                entry.pinned = False
                self.registry.set_policy(entry.key, pinned=False)
            self.registry.set_location(
                entry.key, tier=entry.tier, location=written.location, checksum=written.checksum, state="ready"
            )
            self._enforce_locked({entry.key}, self.clock())
            return entry.tier if self._index.get(entry.key) is entry and entry.has_payload else None

    def _drop_payload_locked(self, e: IndexEntry) -> None:
        """Free ``e``'s payload but keep its row (tokens, text, policy, hits, and ``nbytes``: what
        rebuilding it will take): ``tier = none``, resolvable by id and rebuilt by the next
        request that uses it."""
        self.tiers.discard(e)
        e.has_payload, e.state = False, "ready"
        self.registry.set_location(e.key, tier="none", location=None, checksum=None, state="ready")

    def _forget_locked(self, key: str) -> None:
        """Remove ``key`` entirely: payload, index record, buffered touches, registry row."""
        e = self._index.pop(key, None)
        if e is not None:
            self.tiers.discard(e)
        self.usage.forget(key)
        self.registry.delete(key)

    def _maybe_expire_locked(self, now: float) -> None:
        if now - self._last_expire < self.flush_interval_s:
            return
        self._last_expire = now
        dead = [k for k, e in self._index.items() if e.expired(now)]
        for k in dead:
            self._forget_locked(k)
        self.usage.count("expired", len(dead))

    # ------------------------------------------------------------------ helpers
    def _repaired_locked(self, rec: EntryRecord) -> EntryRecord:
        """``rec`` (with token ids and text), repaired and written back if any of it did not decode;
        its tokens are also checked against its token digest."""
        if not rec.damaged and (
            rec.token_ids is None or rec.token_digest is None or token_digest(rec.token_ids) == rec.token_digest
        ):
            return rec
        e = self._index.get(rec.key)
        truth = e.to_record() if e is not None and e.tenant == rec.tenant else None
        try:
            return repair_row(self.registry, self.disk, rec, truth, self.clock())
        except Exception as exc:  # never fail a read over a repair: answer the row as decoded
            log.warning("registry row %s could not be repaired (%s); answered with defaults", rec.key, exc)
            return rec

    def _repaired_listed_locked(self, rec: EntryRecord) -> EntryRecord:
        full = self.registry.get(rec.key, rec.tenant) if rec.key else None
        if full is None:
            return rec
        fixed = self._repaired_locked(full)
        return fixed.replace(token_ids=None, text=None)

    def _require_open(self) -> None:
        if not self._opened:
            raise RuntimeError("SegmentStore.open() must run before use")
