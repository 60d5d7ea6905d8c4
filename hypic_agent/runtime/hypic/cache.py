"""Segment entry caches seen by the engine.

``EntryCache`` is the small interface the engine needs; ``MemoryEntryCache`` is the in-process
LRU with byte accounting (the default without a persistent store); ``segments.store`` provides
the tiered persistent one (GPU -> CPU -> disk) through ``StoreEntryCache``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

from hypic_agent.runtime.hypic.entry import SegmentEntry


@dataclass
class Lookup:
    entry: SegmentEntry | None
    tier: str | None  # "gpu" | "cpu" | "disk" | "memory" | None (miss)


class EntryCache(Protocol):
    def lookup(self, key: str, *, count: bool = True) -> Lookup:
        """``count=False``: a re-read for a use already looked up (and counted) once."""
        ...

    def insert(self, key: str, entry: SegmentEntry, *, kind: str = "text", tenant: str = "default") -> None: ...


class MemoryEntryCache:
    """LRU over entries, bounded by bytes (0 = unbounded). Thread-safe."""

    def __init__(self, max_bytes: int = 0) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, SegmentEntry] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0
        self.evictions = 0

    def lookup(self, key: str, *, count: bool = True) -> Lookup:
        with self._lock:
            e = self._entries.get(key)
            if e is None:
                return Lookup(None, None)
            self._entries.move_to_end(key)
            return Lookup(e, "memory")

    def insert(self, key: str, entry: SegmentEntry, *, kind: str = "text", tenant: str = "default") -> None:
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.bytes -= old.nbytes()
            self._entries[key] = entry
            self.bytes += entry.nbytes()
            while self.max_bytes and self.bytes > self.max_bytes and len(self._entries) > 1:
                _, ev = self._entries.popitem(last=False)
                self.bytes -= ev.nbytes()
                self.evictions += 1

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries
