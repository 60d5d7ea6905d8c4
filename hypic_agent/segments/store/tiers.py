"""The tier stack of the entry store, fastest first: GPU pool -> CPU -> disk (``SegmentStore.tiers``).

GPU and CPU hold an entry exclusively (``IndexEntry.mem_tier``); the disk copy is written through
(``IndexEntry.location``), so an entry is usually on disk as well. ``Tiers`` places a payload in
the fastest memory tier with room for it, promotes a CPU-resident one to the GPU, demotes one a
tier down, and frees copies; it changes the tiers and the live index records (``index``, shared
with the store), never the registry. The caller holds the store lock.
"""

from __future__ import annotations

from collections.abc import Mapping

from hypic_agent.segments.store.disk_tier import DiskTier
from hypic_agent.segments.store.entries import IndexEntry, Tensors
from hypic_agent.segments.store.memory_tier import MemoryTier
from hypic_agent.segments.store.quota import TenantQuota


class Tiers:
    def __init__(
        self, gpu: MemoryTier, cpu: MemoryTier, disk: DiskTier, quota: TenantQuota, index: Mapping[str, IndexEntry]
    ) -> None:
        self.gpu = gpu
        self.cpu = cpu
        self.disk = disk
        self.quota = quota
        self._index = index

    def memory(self, name: str) -> MemoryTier:
        return self.gpu if name == "gpu" else self.cpu

    def room(self, tier: MemoryTier, e: IndexEntry) -> bool:
        """Whether ``e`` can live in ``tier`` at all: pinned entries there cannot make way, and a
        pinned ``e`` must fit its tenant's quota of the tier."""
        if not tier.fits(e.nbytes) or (e.pinned and not self.quota.pin_fits(tier, e)):
            return False
        pinned = sum(
            self._index[k].nbytes for k in tier.held_keys() if k != e.key and k in self._index and self._index[k].pinned
        )
        return e.nbytes <= tier.budget - pinned

    def place(self, e: IndexEntry, tensors: Tensors) -> Tensors | None:
        """Put the payload in the fastest memory tier with room; ``None`` if none has."""
        for tier in (self.gpu, self.cpu):
            if self.room(tier, e):
                held = tier.put(e.key, tensors)
                e.mem_tier = tier.name
                return held
        e.mem_tier = None
        return None

    def promote(self, e: IndexEntry) -> tuple[Tensors, bool]:
        """The held tensors of memory-resident ``e``, moved up from the CPU to the GPU pool first if
        it has room, and whether they moved."""
        assert e.mem_tier is not None
        if e.mem_tier == "cpu" and self.room(self.gpu, e):
            tensors = self.cpu.pop(e.key)
            assert tensors is not None
            held = self.gpu.put(e.key, tensors)
            e.mem_tier = "gpu"
            return held, True
        held_now = self.memory(e.mem_tier).get(e.key)
        assert held_now is not None
        return held_now, False

    def demote(self, e: IndexEntry, tier: MemoryTier) -> None:
        """Take ``e`` out of memory ``tier``: from the GPU down to the CPU when it has room, else out
        of memory (on disk if it has a file there)."""
        tensors = tier.pop(e.key)
        if tier is self.gpu and tensors is not None and self.room(self.cpu, e):
            self.cpu.put(e.key, tensors)
            e.mem_tier = "cpu"
        else:
            e.mem_tier = None

    def remove_file(self, e: IndexEntry) -> None:
        """Delete ``e``'s disk copy, if it has one."""
        if e.location is not None:
            self.disk.remove(e.location)
            self.disk.used -= e.file_bytes
        e.location, e.checksum, e.file_bytes = None, None, 0

    def discard(self, e: IndexEntry) -> None:
        """Free every copy of ``e``'s payload (memory and disk)."""
        self.gpu.pop(e.key)
        self.cpu.pop(e.key)
        self.remove_file(e)
        e.mem_tier = None
