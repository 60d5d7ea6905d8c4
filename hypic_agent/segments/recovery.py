"""Start-up recovery: make the registry and the store dir agree again after a crash or restart.

* temp files (``*.tmp``, a write that never reached its rename) are removed;
* rows whose TTL ran out are dropped;
* rows whose payload did not survive (state ``writing``: the process died before the file was
  published; the payload lived only in memory (GPU / CPU); the file is missing) keep their
  row as ``tier = none``, like registered definitions: their tokens and text stay, the id still
  resolves, and the next request that uses it rebuilds the payload;
* files no row points to (orphans, including the unpublished file of a ``writing`` row) are removed.

Rows with a published file are indexed as disk-resident. Checksums are not re-read here (that
would read every file); each is verified when the entry is first loaded.
"""

from __future__ import annotations

import logging

from hypic_agent.segments.entries import IndexEntry
from hypic_agent.segments.registry import Registry
from hypic_agent.segments.tiers import DiskTier

log = logging.getLogger(__name__)


def recover(registry: Registry, disk: DiskTier, now: float) -> list[IndexEntry]:
    files, temps = disk.scan()
    for tmp in temps:
        tmp.unlink(missing_ok=True)
    keep: list[IndexEntry] = []
    drop: list[str] = []
    bare: list[str] = []
    referenced: set[str] = set()
    for rec in registry.records():
        if rec.expires_at is not None and rec.expires_at <= now:
            drop.append(rec.key)
        elif rec.state == "ready" and rec.location is not None and rec.location in files:
            referenced.add(rec.location)
            keep.append(IndexEntry.from_record(rec, file_bytes=files[rec.location]))
            if rec.tier != "disk":
                registry.set_location(rec.key, tier="disk")
        else:
            row = rec.replace(tier="none", location=None, checksum=None, state="ready")
            keep.append(IndexEntry.from_record(row))
            if row != rec:
                bare.append(rec.key)
    registry.delete_many(drop)
    registry.clear_payloads(bare)
    orphans = [loc for loc in files if loc not in referenced]
    for loc in orphans:
        disk.remove(loc)
    if drop or bare or orphans or temps:
        log.info(
            "store recovery: dropped %d expired rows, %d rows lost their payload (kept as tier none), "
            "%d orphan files, %d temp files",
            len(drop), len(bare), len(orphans), len(temps),
        )  # fmt: skip
    return keep
