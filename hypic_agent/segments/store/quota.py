"""Tenants' shares of the tier budgets: a pin quota and an eviction reserve (``SegmentStore.quota``).

Each tenant has a *share* of every tier's budget (``TenantShares``; ``Settings.tenant_share``,
default one over the number of tenants, and ``Settings.tenant_shares`` per tenant):

* quota: the bytes of a tenant's pinned entries in a tier never exceed its share of the budget
  (and all tenants' pinned bytes never exceed the budget). Pinning over it raises
  ``PinQuotaError`` (409; ``EntryTooLargeError``, 413, when the entry alone is over the quota);
  a pinned entry that would not fit a memory tier's quota is held in the next tier down;
* reserve: when one tenant's entry needs room, another tenant's entries are shed only while
  that tenant holds more than its reserve (its share, scaled down when the shares of the known
  tenants add up to more than 1), so a tenant within its reserve is never touched by others;
  a tenant's own entries can always make way for it. With reserves that add up to at most the
  budget and pins within them, some tenant is always over its reserve while a tier is over
  budget, so budgets still hold.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hypic_agent.config import Settings
from hypic_agent.errors import ConflictError, PayloadTooLargeError
from hypic_agent.segments.store.disk_tier import DiskTier
from hypic_agent.segments.store.entries import IndexEntry
from hypic_agent.segments.store.memory_tier import MemoryTier


class PinQuotaError(ConflictError):
    type = "pin_quota_exceeded"


class EntryTooLargeError(PayloadTooLargeError):
    type = "pin_quota_exceeded"


@dataclass(frozen=True)
class TenantShares:
    """``default`` share of each tier for any tenant, ``overrides`` per tenant, the ``tenants``
    the server knows of (their reserves are scaled to add up to at most the whole budget)."""

    default: float = 1.0
    overrides: Mapping[str, float] = field(default_factory=dict)
    tenants: tuple[str, ...] = ()

    @classmethod
    def from_settings(cls, settings: Settings) -> TenantShares:
        keyed = set(settings.api_keys.values())
        default = settings.tenant_share if settings.tenant_share is not None else 1.0 / max(1, len(keyed))
        return cls(default, dict(settings.tenant_shares), tuple(sorted(keyed | set(settings.tenant_shares))))

    def share(self, tenant: str) -> float:
        return self.overrides.get(tenant, self.default)

    def quota(self, tenant: str, budget: int) -> int:
        return int(self.share(tenant) * budget)

    def reserve(self, tenant: str, budget: int) -> int:
        if len(self.tenants) < 2:
            return 0  # nobody else to be protected from
        total = sum(self.share(t) for t in self.tenants)
        return int(self.share(tenant) / max(1.0, total) * budget)


def _mb(n: int) -> str:
    return f"{n / 1e6:.3g} MB" if n >= 10_000 else f"{n} bytes"


class TenantQuota:
    """Pinned bytes per tenant and tier, the pin quota they must stay within, and the bytes each
    tenant holds in a tier (what its eviction reserve is checked against). Reads the store's live
    index (``index``, shared, never changed here); the caller holds the store lock."""

    def __init__(
        self, shares: TenantShares, gpu: MemoryTier, cpu: MemoryTier, disk: DiskTier, index: Mapping[str, IndexEntry]
    ) -> None:
        self.shares = shares
        self.gpu = gpu
        self.cpu = cpu
        self.disk = disk
        self._index = index

    def check_pin_room(self, tenant: str) -> None:
        """Raise ``PinQuotaError`` when ``tenant`` has no pin quota left at all (checked before
        computing entries that are to be pinned)."""
        tiers: list[Any] = [self.disk] if self.disk.enabled else [t for t in (self.gpu, self.cpu) if t.enabled]
        for tier in tiers:
            quota = self.shares.quota(tenant, tier.budget)
            used = self.pinned_bytes(tier.name, tenant=tenant)
            if used < quota and self.pinned_bytes(tier.name) < tier.budget:
                return
        if tiers:
            raise PinQuotaError(
                f"tenant {tenant!r} has {_mb(used)} pinned: its whole quota of {_mb(quota)} "
                f"({self.shares.share(tenant):.0%} of the {tier.name} tier's {_mb(tier.budget)}; "
                "HYPIC_TENANT_SHARE): unpin or delete some of its segments, or store these unpinned",
                param="cache.pin",
            )

    def pinned_bytes(self, tier: str, *, tenant: str | None = None, skip: str | None = None) -> int:
        """Bytes of pinned entries (of ``tenant``, or everyone's) held in ``tier``."""
        total = 0
        for e in self._index.values():
            if not e.pinned or e.key == skip or (tenant is not None and e.tenant != tenant):
                continue
            if tier == "disk":
                total += e.file_bytes if e.location else 0
            elif e.mem_tier == tier:
                total += e.nbytes
        return total

    def pin_fits(self, tier: MemoryTier, e: IndexEntry) -> bool:
        """Whether pinned ``e`` may be held in memory ``tier`` within its tenant's quota."""
        mine = self.pinned_bytes(tier.name, tenant=e.tenant, skip=e.key)
        return mine + e.nbytes <= self.shares.quota(e.tenant, tier.budget)

    def pin_error(self, e: IndexEntry, nbytes: int) -> Exception | None:
        """Why ``e`` (``nbytes`` of payload; on disk its file's bytes once written) may not be
        pinned, or ``None``: the disk tier holds every pinned entry (write-through), so its quota
        decides; without a disk tier, the memory tiers' quotas do."""
        tiers: list[Any] = [self.disk] if self.disk.enabled else [t for t in (self.gpu, self.cpu) if t.enabled]
        errors: list[Exception] = []
        for tier in tiers:
            nbytes = e.file_bytes if tier is self.disk and e.file_bytes else nbytes
            quota = self.shares.quota(e.tenant, tier.budget)
            mine = self.pinned_bytes(tier.name, tenant=e.tenant, skip=e.key)
            everyone = self.pinned_bytes(tier.name, skip=e.key)
            share = f"{self.shares.share(e.tenant):.0%} of the {tier.name} tier's {_mb(tier.budget)}"
            if nbytes > quota:
                errors.append(
                    EntryTooLargeError(
                        f"segment {e.key} needs {_mb(nbytes)} pinned; tenant {e.tenant!r} may pin at most "
                        f"{_mb(quota)} ({share}; HYPIC_TENANT_SHARE): keep it unpinned",
                        param="cache.pin",
                    )
                )
            elif mine + nbytes > quota or everyone + nbytes > tier.budget:
                errors.append(
                    PinQuotaError(
                        f"pinning segment {e.key} ({_mb(nbytes)}) would take tenant {e.tenant!r} to "
                        f"{_mb(mine + nbytes)} pinned of its quota of {_mb(quota)} ({share}; HYPIC_TENANT_SHARE)"
                        + ("" if everyone + nbytes <= tier.budget else " and the tier over its budget")
                        + ": unpin or delete some of its segments",
                        param="cache.pin",
                    )
                )
            else:
                return None  # one tier that can hold it is enough
        return errors[0] if errors else None

    def usage(self, tier: str, size_of: Callable[[IndexEntry], int]) -> Counter[str]:
        """Bytes (``size_of`` each entry) every tenant holds in ``tier``."""
        out: Counter[str] = Counter()
        for e in self._index.values():
            if (tier == "disk" and e.location) or (tier != "disk" and e.mem_tier == tier):
                out[e.tenant] += size_of(e)
        return out
