"""Registry of stored segment entries (SQLAlchemy 2): SQLite file by default, any URL works.

One row per ``SegmentKey``. The row says where the entry's payload lives (``tier``:
``gpu | cpu | disk | none``; ``location``: the disk file, relative to the store dir), how to
check it (``checksum`` of the file bytes, ``model_fingerprint``, ``token_digest``), and what
the eviction policy needs (``nbytes``, ``prefill_ms``, ``hits``, ``last_used_at``, ``pinned``,
``ttl_s``). ``state`` is ``writing`` while a disk file is being written, ``ready`` after.
Rows also keep the segment's token ids and framed text so a stored id can be resolved (and
recomputed) after its payload is gone. Methods return ``EntryRecord`` dataclasses, never ORM
objects, so results are safe to share across threads.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Double,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    create_engine,
    delete,
    event,
    func,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, defer, mapped_column, sessionmaker
from sqlalchemy.pool import StaticPool

from hypic_agent.config import Settings
from hypic_agent.errors import InvalidRequestError
from hypic_agent.segments.keys import token_bytes, tokens_from_bytes

Tier = Literal["gpu", "cpu", "disk", "none"]
State = Literal["writing", "ready"]
UNSET: Any = object()
"""Sentinel: leave this field as it is."""


class Base(DeclarativeBase):
    pass


class EntryRow(Base):
    __tablename__ = "hypic_entries"

    seq: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(String(64), unique=True)
    tenant: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(16))
    n_tokens: Mapped[int] = mapped_column(Integer)
    model_fingerprint: Mapped[str] = mapped_column(String(256))
    nbytes: Mapped[int] = mapped_column(BigInteger, default=0)
    tier: Mapped[str] = mapped_column(String(8))
    location: Mapped[str | None] = mapped_column(String(512))
    checksum: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[float] = mapped_column(Double)
    last_used_at: Mapped[float] = mapped_column(Double)
    hits: Mapped[int] = mapped_column(Integer, default=0)
    pinned: Mapped[bool] = mapped_column(Boolean, default=False)
    ttl_s: Mapped[float | None] = mapped_column(Double)
    expires_at: Mapped[float | None] = mapped_column(Double)
    prefill_ms: Mapped[float] = mapped_column(Double, default=0.0)
    state: Mapped[str] = mapped_column(String(8))
    token_digest: Mapped[str | None] = mapped_column(String(64))
    token_ids: Mapped[bytes | None] = mapped_column(LargeBinary)
    text: Mapped[str | None] = mapped_column(Text)
    title: Mapped[str | None] = mapped_column(String(512))
    meta: Mapped[dict[str, Any] | None] = mapped_column(JSON)

    __table_args__ = (
        Index("ix_hypic_entries_tenant_seq", "tenant", "seq"),
        Index("ix_hypic_entries_expires", "expires_at"),
    )


@dataclass(frozen=True)
class EntryRecord:
    """One registry row. ``token_ids`` / ``text`` are ``None`` when not loaded or not kept."""

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

    @property
    def expires_at(self) -> float | None:
        return None if self.ttl_s is None else self.last_used_at + self.ttl_s

    def replace(self, **changes: Any) -> EntryRecord:
        return replace(self, **changes)


@dataclass(frozen=True)
class Page:
    items: list[EntryRecord]
    next_cursor: str | None


_COPIED = [f.name for f in fields(EntryRecord) if f.name not in ("token_ids", "meta", "seq")]


def _to_record(row: EntryRow, *, with_payload_fields: bool = True) -> EntryRecord:
    values = {name: getattr(row, name) for name in _COPIED if with_payload_fields or name != "text"}
    ids = tokens_from_bytes(row.token_ids) if with_payload_fields and row.token_ids is not None else None
    return EntryRecord(**values, token_ids=ids, meta=dict(row.meta or {}), seq=row.seq)


def _fill(row: EntryRow, rec: EntryRecord) -> None:
    for name in _COPIED:
        setattr(row, name, getattr(rec, name))
    row.expires_at = rec.expires_at
    row.token_ids = token_bytes(rec.token_ids) if rec.token_ids is not None else None
    row.meta = dict(rec.meta)


class Registry:
    """CRUD + queries over ``hypic_entries``. Thread-safe (one session per call)."""

    def __init__(self, url: str, *, echo: bool = False) -> None:
        self.url = url
        kwargs: dict[str, Any] = {"echo": echo, "future": True}
        if url.startswith("sqlite"):
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
            path = url.split("///", 1)[1] if "///" in url else ""
            if path in ("", ":memory:"):
                kwargs["poolclass"] = StaticPool
            else:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.engine = create_engine(url, **kwargs)
        if url.startswith("sqlite"):
            event.listen(self.engine, "connect", _sqlite_pragmas)
        Base.metadata.create_all(self.engine)
        self._session = sessionmaker(self.engine, expire_on_commit=False)

    @classmethod
    def from_settings(cls, settings: Settings) -> Registry:
        return cls(settings.resolved_database_url())

    def close(self) -> None:
        self.engine.dispose()

    # ------------------------------------------------------------------ writes
    def upsert(self, rec: EntryRecord) -> EntryRecord:
        """Insert or overwrite the row of ``rec.key`` (``seq`` kept on overwrite)."""
        for _ in range(2):
            try:
                with self._session.begin() as s:
                    row = s.scalars(select(EntryRow).where(EntryRow.key == rec.key)).one_or_none()
                    if row is None:
                        row = EntryRow()
                        s.add(row)
                    _fill(row, rec)
                    s.flush()
                    return _to_record(row)
            except IntegrityError:  # a concurrent insert of the same key won: overwrite it
                continue
        raise RuntimeError(f"could not upsert registry row {rec.key}")

    def delete(self, key: str, tenant: str | None = None) -> bool:
        with self._session.begin() as s:
            stmt = delete(EntryRow).where(EntryRow.key == key)
            if tenant is not None:
                stmt = stmt.where(EntryRow.tenant == tenant)
            return _rowcount(s.execute(stmt)) > 0

    def delete_many(self, keys: Iterable[str]) -> int:
        keys = list(keys)
        if not keys:
            return 0
        with self._session.begin() as s:
            return _rowcount(s.execute(delete(EntryRow).where(EntryRow.key.in_(keys))))

    def clear_payloads(self, keys: Iterable[str]) -> int:
        """Rows whose payload is gone: ``tier = none``, no file, ``ready`` (the rows stay)."""
        keys = list(keys)
        if not keys:
            return 0
        values = {"tier": "none", "location": None, "checksum": None, "state": "ready"}
        with self._session.begin() as s:
            return _rowcount(s.execute(update(EntryRow).where(EntryRow.key.in_(keys)).values(**values)))

    def touch(self, key: str, now: float, hits: int = 1) -> None:
        self.touch_many({key: (now, hits)})

    def touch_many(self, updates: Mapping[str, tuple[float, int]]) -> None:
        """``{key: (last_used_at, hits to add)}``; refreshes each sliding TTL."""
        if not updates:
            return
        with self._session.begin() as s:
            for key, (now, n) in updates.items():
                s.execute(
                    update(EntryRow)
                    .where(EntryRow.key == key)
                    .values(last_used_at=now, hits=EntryRow.hits + n, expires_at=EntryRow.ttl_s + now)
                )

    def set_policy(
        self, key: str, tenant: str | None = None, *, pinned: bool | None = None, ttl_s: Any = UNSET
    ) -> EntryRecord | None:
        """Change ``pinned`` and/or ``ttl_s`` (pass ``ttl_s=None`` to clear it)."""
        if ttl_s is not UNSET and ttl_s is not None and not 0 < ttl_s < math.inf:
            raise InvalidRequestError(f"ttl must be a finite number > 0 seconds, got {ttl_s}", param="cache.ttl")
        with self._session.begin() as s:
            row = self._row(s, key, tenant)
            if row is None:
                return None
            if pinned is not None:
                row.pinned = pinned
            if ttl_s is not UNSET:
                row.ttl_s = ttl_s
                row.expires_at = None if ttl_s is None else row.last_used_at + ttl_s
            s.flush()
            return _to_record(row)

    def set_location(
        self,
        key: str,
        *,
        tier: Tier,
        location: str | None = UNSET,
        checksum: str | None = UNSET,
        state: State | None = None,
        nbytes: int | None = None,
    ) -> bool:
        values: dict[str, Any] = {"tier": tier}
        if location is not UNSET:
            values["location"] = location
        if checksum is not UNSET:
            values["checksum"] = checksum
        if state is not None:
            values["state"] = state
        if nbytes is not None:
            values["nbytes"] = nbytes
        with self._session.begin() as s:
            return _rowcount(s.execute(update(EntryRow).where(EntryRow.key == key).values(**values))) > 0

    # ------------------------------------------------------------------ reads
    def get(self, key: str, tenant: str | None = None) -> EntryRecord | None:
        """The row of ``key`` (only if it belongs to ``tenant`` when one is given)."""
        with self._session() as s:
            row = self._row(s, key, tenant)
            return None if row is None else _to_record(row)

    def list_entries(self, tenant: str, *, limit: int = 50, cursor: str | None = None, kind: str | None = None) -> Page:
        """A tenant's entries, newest first. ``cursor`` is ``next_cursor`` of the previous page."""
        if not 1 <= limit <= 1000:
            raise InvalidRequestError(f"limit must be in [1, 1000], got {limit}", param="limit")
        stmt = (
            select(EntryRow).where(EntryRow.tenant == tenant).options(defer(EntryRow.token_ids), defer(EntryRow.text))
        )
        if kind is not None:
            stmt = stmt.where(EntryRow.kind == kind)
        if cursor is not None:
            # ASCII digits only ("¹".isdigit() is true) and within a BIGINT
            if not (cursor.isascii() and cursor.isdigit() and len(cursor) <= 19 and int(cursor) < 1 << 63):
                raise InvalidRequestError(
                    f"invalid cursor {cursor[:40]!r}; pass next_cursor from the last page", param="cursor"
                )
            stmt = stmt.where(EntryRow.seq < int(cursor))
        stmt = stmt.order_by(EntryRow.seq.desc()).limit(limit + 1)
        with self._session() as s:
            rows = list(s.scalars(stmt))
            items = [_to_record(r, with_payload_fields=False) for r in rows[:limit]]
        more = len(rows) > limit
        return Page(items=items, next_cursor=str(items[-1].seq) if more and items else None)

    def records(self) -> list[EntryRecord]:
        """All rows without token ids / text (for recovery and the in-memory index)."""
        stmt = select(EntryRow).options(defer(EntryRow.token_ids), defer(EntryRow.text)).order_by(EntryRow.seq)
        with self._session() as s:
            return [_to_record(r, with_payload_fields=False) for r in s.scalars(stmt)]

    def expired(self, now: float, limit: int = 1000) -> list[str]:
        """Keys whose sliding TTL has run out by ``now``."""
        stmt = select(EntryRow.key).where(EntryRow.expires_at.is_not(None), EntryRow.expires_at <= now).limit(limit)
        with self._session() as s:
            return list(s.scalars(stmt))

    def count(self, tenant: str | None = None) -> int:
        stmt = select(func.count()).select_from(EntryRow)
        if tenant is not None:
            stmt = stmt.where(EntryRow.tenant == tenant)
        with self._session() as s:
            return int(s.scalar(stmt) or 0)

    @staticmethod
    def _row(s: Any, key: str, tenant: str | None) -> EntryRow | None:
        stmt = select(EntryRow).where(EntryRow.key == key)
        if tenant is not None:
            stmt = stmt.where(EntryRow.tenant == tenant)
        return s.scalars(stmt).one_or_none()


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.close()


def _rowcount(result: Any) -> int:
    """Rows matched by an UPDATE / DELETE (``CursorResult.rowcount``)."""
    return int(getattr(result, "rowcount", 0) or 0)
