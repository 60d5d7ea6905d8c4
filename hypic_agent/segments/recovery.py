"""Start-up recovery: make the registry and the store dir agree again after a crash or restart.

* temp files (``*.tmp``, a write that never reached its rename) are removed;
* rows in state ``writing`` (the process died before the file was published) are dropped;
* rows whose payload lived only in memory (GPU / CPU) or whose file is missing are dropped;
  rows that never had a payload (``tier = none``: registered definitions) are kept;
* rows whose TTL ran out are dropped;
* files no remaining row points to (orphans) are removed.

What remains is indexed as disk-resident. Checksums are not re-read here (that would read
every file); each is verified when the entry is first loaded.
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
    referenced: set[str] = set()
    for rec in registry.records():
        expired = rec.expires_at is not None and rec.expires_at <= now
        if rec.state == "writing" or expired:
            drop.append(rec.key)
        elif rec.location is None and rec.tier == "none":
            keep.append(IndexEntry.from_record(rec))
        elif rec.location is not None and rec.location in files:
            referenced.add(rec.location)
            keep.append(IndexEntry.from_record(rec, file_bytes=files[rec.location]))
            if rec.tier != "disk":
                registry.set_location(rec.key, tier="disk")
        else:
            drop.append(rec.key)
    registry.delete_many(drop)
    orphans = [loc for loc in files if loc not in referenced]
    for loc in orphans:
        disk.remove(loc)
    if drop or orphans or temps:
        log.info("store recovery: dropped %d rows, %d orphan files, %d temp files", len(drop), len(orphans), len(temps))
    return keep
