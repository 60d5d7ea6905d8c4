"""Start-up recovery: make the registry and the store dir agree again after a crash, a restart or
damage to either.

* temp files (``*.tmp``, a write that never reached its rename, never acknowledged) are removed;
* rows whose TTL ran out are dropped with their files;
* rows whose payload did not survive (the payload lived only in memory (GPU / CPU); the file is
  missing) keep their row as ``tier = none``, like registered definitions: their tokens and text
  stay, the id still resolves, and the next request that uses it rebuilds the payload;
* files no row points to are never simply deleted: each one's self-describing header
  (``headers.py``) is checked against its bytes and its row is rebuilt from it (a lost or damaged
  WAL, an emptied or quarantined registry), or given back to the row of its key that lost it (a
  ``writing`` row whose file was published just before a crash); a file that cannot be read, or
  a stale second copy of a key, is moved into ``<store>/quarantine/``;
* rows with fields that do not decode (``EntryRecord.damaged``) are repaired from their file's
  header (or, without one, keep safe defaults: their token ids, if lost, leave the id
  unresolvable); a row whose key, tenant, kind or fingerprint is lost is written to
  ``<store>/quarantine/rows.<time>.jsonl`` and removed (its file, if any, rebuilds it).

Rows with a published file are indexed as disk-resident. Checksums of files that rows point to
are not re-read here (that would read every file); each is verified when the entry is first
loaded. Everything damaged is logged at warning level with what went where.
"""

from __future__ import annotations

import base64
import json
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypic_agent.segments.prompt.keys import token_digest
from hypic_agent.segments.store.disk_tier import CorruptEntryError, DiskTier, FileHeader
from hypic_agent.segments.store.entries import IndexEntry
from hypic_agent.segments.store.headers import record_from_header, repair
from hypic_agent.segments.store.integrity import stamp
from hypic_agent.segments.store.record import IDENTITY, EntryRecord
from hypic_agent.segments.store.registry import Registry

log = logging.getLogger(__name__)


@dataclass
class RecoveryReport:
    """What ``recover`` did; ``SegmentStore.recovery`` keeps the last one."""

    entries: list[IndexEntry] = field(default_factory=list)
    rebuilt: list[str] = field(default_factory=list)  # rows rebuilt from a file's header (there was none)
    adopted: list[str] = field(default_factory=list)  # rows given back the file they had lost
    repaired: dict[str, tuple[str, ...]] = field(default_factory=dict)  # key -> fields repaired
    quarantined_files: list[Path] = field(default_factory=list)
    quarantined_rows: int = 0
    rows_file: Path | None = None
    expired: int = 0
    bare: int = 0  # rows whose payload did not survive (tier none)
    temps: int = 0
    registry_quarantine: list[Path] = field(default_factory=list)

    @property
    def damage(self) -> bool:
        return bool(
            self.rebuilt or self.adopted or self.repaired or self.quarantined_files or self.quarantined_rows
        ) or bool(self.registry_quarantine)


def recover(registry: Registry, disk: DiskTier, now: float) -> RecoveryReport:
    report = RecoveryReport()
    if registry.quarantined is not None:
        report.registry_quarantine = list(registry.quarantined.moved)
    files, temps = disk.scan()
    for tmp in temps:
        tmp.unlink(missing_ok=True)
    report.temps = len(temps)
    headers = _Headers(disk, now)

    rows: dict[str, EntryRecord] = {}
    broken: list[EntryRecord] = []
    for rec in registry.records(check_tokens=True):
        if any(name in rec.damaged for name in IDENTITY) or rec.key in rows:
            broken.append(rec)
        else:
            rows[rec.key] = rec
    live = {
        r.key: r.location
        for r in rows.values()
        if r.state == "ready" and r.location is not None and r.location in files
    }
    if broken:
        _quarantine_rows(registry, disk, broken, report)

    # files no row points to: rebuild their rows, or give them back, or quarantine them
    referenced = set(live.values())
    found: dict[str, list[tuple[str, EntryRecord]]] = defaultdict(list)
    for loc in sorted(loc for loc in files if loc not in referenced):
        built = headers.record(loc)
        if built is None:
            _quarantine_file(disk, loc, headers.problems.get(loc, "unreadable"), report)
        else:
            found[built.key].append((loc, built))
    rebuilt: list[tuple[str, EntryRecord]] = []
    for key, copies in found.items():
        copies.sort(key=lambda c: headers.mtime(c[0]), reverse=True)
        loc, best = copies[0]
        for stale, _ in copies[1:]:
            _quarantine_file(disk, stale, f"a second copy of {key}", report)
        row = rows.get(key)
        if row is None:
            rebuilt.append((loc, best))
        elif key in live:
            _quarantine_file(disk, loc, f"{key}'s row names another file", report)
        elif row.model_fingerprint == best.model_fingerprint and row.token_digest in (None, best.token_digest):
            full = registry.get(key) or row
            damaged = _with_token_check(full, full.damaged)
            fixed = repair(full.replace(damaged=damaged), best, now) if damaged else full
            fixed = fixed.replace(tier="disk", location=loc, checksum=best.checksum, state="ready", nbytes=best.nbytes)
            rows[key] = _strip(registry.upsert(fixed))
            live[key] = loc
            report.adopted.append(key)
            if damaged:
                report.repaired[key] = damaged
        else:
            _quarantine_file(disk, loc, f"another entry's content than {key}'s row", report)
    for loc, rec in sorted(rebuilt, key=lambda c: (c[1].created_at, c[1].key)):
        rows[rec.key] = _strip(registry.upsert(rec))
        live[rec.key] = loc
        report.rebuilt.append(rec.key)

    # rows with values that do not decode: repair them from their file's header
    for key, listed in list(rows.items()):
        if not listed.damaged or key in report.repaired:
            continue
        whole = registry.get(key)
        if whole is None:
            continue
        damaged = _with_token_check(whole, tuple(dict.fromkeys((*listed.damaged, *whole.damaged))))
        source: EntryRecord | None = None
        if key in live:
            source = headers.record(live[key])
            if source is None or source.key != key:
                loc = live.pop(key)
                _quarantine_file(disk, loc, headers.problems.get(loc, f"it belongs to {source and source.key}"), report)
                source = None
        fixed = repair(whole.replace(damaged=damaged), source, now)
        if key not in live:
            fixed = fixed.replace(tier="none", location=None, checksum=None, state="ready")
        rows[key] = _strip(registry.upsert(fixed))
        report.repaired[key] = damaged

    keep: list[IndexEntry] = []
    drop: list[str] = []
    bare: list[str] = []
    for rec in rows.values():
        if rec.expires_at is not None and rec.expires_at <= now:
            drop.append(rec.key)
            disk.remove(live.get(rec.key))
        elif rec.key in live:
            loc = live[rec.key]
            keep.append(IndexEntry.from_record(rec.replace(location=loc, state="ready"), file_bytes=files[loc]))
            if rec.tier != "disk" or rec.location != loc or rec.state != "ready":
                registry.set_location(rec.key, tier="disk", location=loc, state="ready")
        else:
            row = rec.replace(tier="none", location=None, checksum=None, state="ready")
            keep.append(IndexEntry.from_record(row))
            if row != rec:
                bare.append(rec.key)
    registry.delete_many(drop)
    registry.clear_payloads(bare)
    report.entries, report.expired, report.bare = keep, len(drop), len(bare)
    _log(report, disk)
    return report


def repair_row(
    registry: Registry, disk: DiskTier, full: EntryRecord, truth: EntryRecord | None, now: float
) -> EntryRecord:
    """Repair a damaged row found while serving (``full``: with token ids and text) from its file's
    header and ``truth`` (the store's live index record of it), write it back and return it. A row
    whose identity is damaged is returned with defaults, unwritten (recovery deals with it)."""
    damaged = _with_token_check(full, full.damaged)
    if not damaged:
        return full
    if any(name in damaged for name in IDENTITY) and truth is None:
        return full
    source: EntryRecord | None = None
    location = truth.location if truth is not None else full.location
    if location:
        source = _Headers(disk, now).record(location)
    if truth is not None:
        source = truth if source is None else truth.replace(
            token_ids=source.token_ids, token_digest=source.token_digest, text=source.text, title=source.title,
            meta=source.meta,
        )  # fmt: skip
    fixed = repair(full.replace(damaged=damaged), source, now)
    if truth is not None:  # identity from the live index
        fixed = fixed.replace(**{name: getattr(truth, name) for name in IDENTITY})
    out = registry.upsert(fixed)
    log.warning(
        "registry row %s had fields that did not decode (%s): repaired from %s",
        full.key, ", ".join(damaged), "its payload file's header" if location and source is not None else "defaults",
    )  # fmt: skip
    return out


class _Headers:
    """Payload file headers read at most once each, with why a file could not be used."""

    def __init__(self, disk: DiskTier, now: float) -> None:
        self.disk = disk
        self.now = now
        self.problems: dict[str, str] = {}
        self._seen: dict[str, FileHeader | None] = {}
        self._records: dict[str, EntryRecord | None] = {}

    def header(self, loc: str) -> FileHeader | None:
        if loc not in self._seen:
            try:
                self._seen[loc] = self.disk.inspect(loc)
            except CorruptEntryError as exc:
                self._seen[loc] = None
                self.problems[loc] = str(exc)
        return self._seen[loc]

    def record(self, loc: str) -> EntryRecord | None:
        if loc not in self._records:
            h = self.header(loc)
            rec = None
            if h is not None:
                try:
                    rec = record_from_header(h, self.now)
                except CorruptEntryError as exc:
                    self.problems[loc] = str(exc)
            self._records[loc] = rec
        return self._records[loc]

    def mtime(self, loc: str) -> float:
        h = self.header(loc)
        return h.mtime if h is not None else 0.0


def _with_token_check(full: EntryRecord, damaged: tuple[str, ...]) -> tuple[str, ...]:
    """``damaged``, plus ``token_ids`` when the row's tokens do not match its token digest."""
    ids, digest = full.token_ids, full.token_digest
    if "token_ids" not in damaged and ids is not None and digest is not None and token_digest(ids) != digest:
        return (*damaged, "token_ids")
    return damaged


def _strip(rec: EntryRecord) -> EntryRecord:
    return rec.replace(token_ids=None, text=None)


def _quarantine_file(disk: DiskTier, loc: str, why: str, report: RecoveryReport) -> None:
    moved = disk.quarantine(loc)
    if moved is not None:
        report.quarantined_files.append(moved)
        log.warning("store recovery: payload file %s quarantined to %s (%s)", loc, moved, why)


def _quarantine_rows(registry: Registry, disk: DiskTier, broken: list[EntryRecord], report: RecoveryReport) -> None:
    """Write rows that cannot be keyed (as the driver returned them) to a JSONL file, then remove them."""
    seqs = [r.seq for r in broken if r.seq is not None]
    raw = registry.raw_rows(seqs)
    disk.quarantine_dir.mkdir(parents=True, exist_ok=True)
    path = disk.quarantine_dir / f"rows.{stamp()}.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for row in raw:
            f.write(json.dumps({k: _jsonable(v) for k, v in row.items()}, default=str) + "\n")
    registry.delete_seqs(seqs)
    report.quarantined_rows, report.rows_file = len(raw), path
    log.warning(
        "store recovery: %d registry rows whose key, tenant, kind or fingerprint did not decode were moved to %s "
        "(fields: %s); their payload files, if any, rebuild them",
        len(raw), path, "; ".join(f"seq {r.seq}: {', '.join(r.damaged) or 'duplicate key'}" for r in broken[:5]),
    )  # fmt: skip


def _jsonable(v: Any) -> Any:
    if isinstance(v, bytes | bytearray | memoryview):
        return {"base64": base64.b64encode(bytes(v)).decode()}
    return v


def _log(r: RecoveryReport, disk: DiskTier) -> None:
    if r.damage:
        log.warning(
            "store recovery after damage: %d rows rebuilt from payload headers, %d rows given back their file, "
            "%d rows repaired (%s), %d files and %d rows quarantined under %s%s",
            len(r.rebuilt), len(r.adopted), len(r.repaired),
            "; ".join(f"{k}: {', '.join(v)}" for k, v in list(r.repaired.items())[:5]) or "-",
            len(r.quarantined_files), r.quarantined_rows, disk.quarantine_dir,
            f"; registry quarantined: {', '.join(map(str, r.registry_quarantine))}" if r.registry_quarantine else "",
        )  # fmt: skip
    if r.expired or r.bare or r.temps:
        log.info(
            "store recovery: dropped %d expired rows, %d rows lost their payload (kept as tier none), %d temp files",
            r.expired, r.bare, r.temps,
        )  # fmt: skip
