"""Shared helpers for store tests."""

from __future__ import annotations

import torch

from hypic_agent.segments.prompt.keys import segment_key
from hypic_agent.segments.store.entries import EntryMeta
from hypic_agent.segments.store.registry import Registry
from hypic_agent.segments.store.segment_store import SegmentStore

FP = "tiny-model:fp32:abc"
NBYTES = 256  # payload() is 64 float32 values


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def key(i: int, fp: str = FP, tenant: str = "t1") -> str:
    return segment_key([i, i + 1], model_fingerprint=fp, tenant=tenant, seam=8)


def payload(i: int, n: int = 64) -> dict[str, torch.Tensor]:
    """An opaque entry: one fp32 state ``[n]`` plus an int tensor, distinct per ``i``."""
    return {"layer0.S": torch.arange(n, dtype=torch.float32) + i, "seam_ids": torch.tensor([i], dtype=torch.int32)}


def meta(i: int = 0, *, fp: str = FP, tenant: str = "t1", prefill_ms: float = 10.0, **kw) -> EntryMeta:
    return EntryMeta(
        tenant=tenant, kind="document", n_tokens=2, model_fingerprint=fp, prefill_ms=prefill_ms,
        token_ids=(i, i + 1), text=f"doc {i}", **kw,
    )  # fmt: skip


def entry_bytes(i: int = 0) -> int:
    return sum(t.numel() * t.element_size() for t in payload(i).values())


def make_store(tmp_path, *, clock=None, registry: Registry | None = None, **kw) -> SegmentStore:
    reg = registry or Registry(f"sqlite:///{tmp_path / 'registry.sqlite3'}")
    opts = dict(gpu_device=None, cpu_budget_bytes=1 << 20, disk_budget_bytes=1 << 20, flush_interval_s=0.0)
    opts.update(kw)
    return SegmentStore(reg, tmp_path / "store", clock=clock or FakeClock(), **opts).open()


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k].cpu(), b[k].cpu()) for k in a)
