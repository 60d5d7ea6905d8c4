"""A registry row as the store reads and writes it: ``EntryRecord`` (a frozen dataclass, never an
ORM object, so it is safe to share across threads), a page of them (``Page``), and the fields
that identify a row (``IDENTITY``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

Tier = Literal["gpu", "cpu", "disk", "none"]
State = Literal["writing", "ready"]
UNSET: Any = object()
"""Sentinel: leave this field as it is."""


@dataclass(frozen=True)
class EntryRecord:
    """One registry row. ``token_ids`` / ``text`` are ``None`` when not loaded or not kept.

    ``damaged`` names the fields whose stored values did not decode (they hold a safe default
    here: ``{}``, ``None``, ``0``, ``tier = none``); empty for a sound row."""

    key: str
    tenant: str
    kind: str
    n_tokens: int
    model_fingerprint: str
    created_at: float
    last_used_at: float
    nbytes: int = 0
    tier: Tier = "none"
    location: str | None = None
    checksum: str | None = None
    hits: int = 0
    pinned: bool = False
    ttl_s: float | None = None
    prefill_ms: float = 0.0
    state: State = "ready"
    token_digest: str | None = None
    token_ids: tuple[int, ...] | None = None
    text: str | None = None
    title: str | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)
    seq: int | None = None
    damaged: tuple[str, ...] = ()

    @property
    def expires_at(self) -> float | None:
        return None if self.ttl_s is None else self.last_used_at + self.ttl_s

    def replace(self, **changes: Any) -> EntryRecord:
        return replace(self, **changes)


IDENTITY = ("key", "tenant", "kind", "model_fingerprint")
"""Fields without which a row cannot be told apart or checked: damage here is not repaired from
defaults (the row is rebuilt from its payload file's header, or quarantined)."""


@dataclass(frozen=True)
class Page:
    items: list[EntryRecord]
    next_cursor: str | None
