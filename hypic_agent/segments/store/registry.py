"""Registry of stored segment entries (SQLAlchemy 2): SQLite file by default, any URL works.

One row per ``SegmentKey``. The row says where the entry's payload lives (``tier``:
``gpu | cpu | disk | none``; ``location``: the disk file, relative to the store dir), how to
check it (``checksum`` of the file bytes, ``model_fingerprint``, ``token_digest``), and what
the eviction policy needs (``nbytes``, ``prefill_ms``, ``hits``, ``last_used_at``, ``pinned``,
``ttl_s``). ``state`` is ``writing`` while a disk file is being written, ``ready`` after.
Rows also keep the segment's token ids and framed text so a stored id can be resolved (and
recomputed) after its payload is gone. Methods return ``EntryRecord`` dataclasses, never ORM
objects, so results are safe to share across threads.

Damage: a SQLite file that fails ``PRAGMA integrity_check`` at start is quarantined and its
readable rows salvaged into a fresh file (``integrity.py``; ``Registry.quarantined`` says what
happened). Rows are read as raw values and decoded one by one (``row_decoding.py``): a value
that does not decode is replaced by a safe default and named in ``EntryRecord.damaged``, so one
bad row never fails a lookup, a listing or start-up; the store repairs such rows from the payload
files' headers (``recovery.py``). Writes go through SQL statements, never through ORM objects
loaded from a possibly damaged row.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

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
    insert,
    select,
    type_coerce,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker
from sqlalchemy.pool import StaticPool
from sqlalchemy.types import NullType

from hypic_agent.config import Settings
from hypic_agent.errors import InvalidRequestError
from hypic_agent.segments.prompt.keys import token_bytes
from hypic_agent.segments.store.integrity import Quarantined, check_sqlite, lenient_text, quarantine_db, sqlite_path
from hypic_agent.segments.store.record import UNSET, EntryRecord, Page, State, Tier
from hypic_agent.segments.store.row_decoding import decode_row

log = logging.getLogger(__name__)


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


_COPIED = [f.name for f in fields(EntryRecord) if f.name not in ("token_ids", "meta", "seq", "damaged")]
_TABLE: Any = EntryRow.__table__
COLUMNS: tuple[str, ...] = tuple(c.name for c in _TABLE.c)


def _raw(*skip: str) -> list[Any]:
    """Every column as the driver returns it (no type processing: a bad value cannot fail the query)."""
    return [type_coerce(c, NullType()).label(c.name) for c in _TABLE.c if c.name not in skip]


def _values(rec: EntryRecord) -> dict[str, Any]:
    values = {name: getattr(rec, name) for name in _COPIED}
    values["expires_at"] = rec.expires_at
    values["token_ids"] = token_bytes(rec.token_ids) if rec.token_ids is not None else None
    values["meta"] = dict(rec.meta)
    return values


class Registry:
    """CRUD + queries over ``hypic_entries``. Thread-safe (one session per call)."""

    def __init__(self, url: str, *, echo: bool = False, check: bool = True) -> None:
        self.url = url
        self.quarantined: Quarantined | None = None
        kwargs: dict[str, Any] = {"echo": echo, "future": True}
        path = sqlite_path(url)
        if url.startswith("sqlite"):
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
            if path is None:
                kwargs["poolclass"] = StaticPool
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                if check:
                    self._check_file(path)
        self.engine = create_engine(url, **kwargs)
        if url.startswith("sqlite"):
            event.listen(self.engine, "connect", _sqlite_pragmas)
        Base.metadata.create_all(self.engine)
        self._session = sessionmaker(self.engine, expire_on_commit=False)
        if self.quarantined is not None and self.quarantined.rows:
            self._restore(self.quarantined)

    @classmethod
    def from_settings(cls, settings: Settings) -> Registry:
        return cls(settings.resolved_database_url())

    def close(self) -> None:
        self.engine.dispose()

    # ------------------------------------------------------------------ integrity
    def _check_file(self, path: Path) -> None:
        """Quarantine a damaged SQLite file before anything opens it (``integrity.py``)."""
        problem = check_sqlite(path)
        if problem is None:
            return
        q = quarantine_db(path, problem, _TABLE.name, COLUMNS)
        self.quarantined = q
        log.warning(
            "registry %s failed its integrity check (%s): moved to %s; %d rows salvaged%s; the rest is "
            "rebuilt from the payload files' headers",
            path, problem, ", ".join(str(p) for p in q.moved), len(q.rows),
            " (some pages were unreadable)" if q.unreadable else "",
        )  # fmt: skip

    def _restore(self, q: Quarantined) -> None:
        """Insert the salvaged rows as they were (raw values; decoded like any row when read)."""
        cols = ", ".join(q.columns)
        marks = ", ".join("?" for _ in q.columns)
        restored = 0
        with self.engine.connect() as conn:
            dbapi = conn.connection.dbapi_connection
            assert dbapi is not None
            for row in q.rows:
                try:
                    dbapi.execute(f"INSERT OR IGNORE INTO {_TABLE.name} ({cols}) VALUES ({marks})", row)
                    restored += 1
                except Exception as exc:  # a NULL where none may be, a value SQLite refuses
                    log.warning("registry: a salvaged row (seq %r) could not be restored: %s", row[0], exc)
            dbapi.commit()
        log.info("registry: %d of %d salvaged rows restored", restored, len(q.rows))

    # ------------------------------------------------------------------ writes
    def upsert(self, rec: EntryRecord) -> EntryRecord:
        """Insert or overwrite the row of ``rec.key`` (``seq`` kept on overwrite)."""
        values = _values(rec)
        for _ in range(2):
            try:
                with self._session.begin() as s:
                    seq = s.scalar(select(EntryRow.seq).where(EntryRow.key == rec.key))
                    if seq is None:
                        result: Any = s.execute(insert(EntryRow).values(**values))
                        seq = result.inserted_primary_key[0]
                    else:
                        s.execute(update(EntryRow).where(EntryRow.seq == seq).values(**values))
                    return rec.replace(seq=int(seq), damaged=())
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

    def delete_seqs(self, seqs: Iterable[int]) -> int:
        """Remove rows by ``seq`` (rows whose key itself is damaged)."""
        seqs = list(seqs)
        if not seqs:
            return 0
        with self._session.begin() as s:
            return _rowcount(s.execute(delete(EntryRow).where(EntryRow.seq.in_(seqs))))

    def raw_rows(self, seqs: Iterable[int]) -> list[dict[str, Any]]:
        """Rows as the driver returns them (to quarantine a row that cannot be decoded)."""
        seqs = list(seqs)
        if not seqs:
            return []
        with self._session() as s:
            return [dict(m) for m in s.execute(select(*_raw()).where(EntryRow.seq.in_(seqs))).mappings()]

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
            rec = self._get(s, key, tenant)
            if rec is None:
                return None
            values: dict[str, Any] = {}
            if pinned is not None:
                values["pinned"] = pinned
                rec = rec.replace(pinned=pinned)
            if ttl_s is not UNSET:
                values["ttl_s"] = ttl_s
                values["expires_at"] = None if ttl_s is None else rec.last_used_at + ttl_s
                rec = rec.replace(ttl_s=ttl_s)
            if values:
                s.execute(update(EntryRow).where(EntryRow.seq == rec.seq).values(**values))
            return rec

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
            return self._get(s, key, tenant)

    def list_entries(self, tenant: str, *, limit: int = 50, cursor: str | None = None, kind: str | None = None) -> Page:
        """A tenant's entries, newest first. ``cursor`` is ``next_cursor`` of the previous page."""
        if not 1 <= limit <= 1000:
            raise InvalidRequestError(f"limit must be in [1, 1000], got {limit}", param="limit")
        stmt = select(*_raw("token_ids", "text")).where(EntryRow.tenant == tenant)
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
            rows = [decode_row(m, with_payload_fields=False) for m in s.execute(stmt).mappings()]
        items = rows[:limit]
        more = len(rows) > limit
        return Page(items=items, next_cursor=str(items[-1].seq) if more and items else None)

    def records(self, *, check_tokens: bool = False) -> list[EntryRecord]:
        """All rows without token ids / text (for recovery and the in-memory index);
        ``check_tokens`` also decodes each row's token ids against its digest (``damaged``)."""
        skip = ("text",) if check_tokens else ("token_ids", "text")
        stmt = select(*_raw(*skip)).order_by(EntryRow.seq)
        with self._session() as s:
            return [
                decode_row(m, with_payload_fields=False, check_tokens=check_tokens) for m in s.execute(stmt).mappings()
            ]

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
    def _get(s: Any, key: str, tenant: str | None) -> EntryRecord | None:
        stmt = select(*_raw()).where(EntryRow.key == key)
        if tenant is not None:
            stmt = stmt.where(EntryRow.tenant == tenant)
        m = s.execute(stmt.limit(1)).mappings().first()
        return None if m is None else decode_row(m)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    dbapi_conn.text_factory = lenient_text  # a flipped byte in a TEXT value must not fail the query
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.close()


def _rowcount(result: Any) -> int:
    """Rows matched by an UPDATE / DELETE (``CursorResult.rowcount``)."""
    return int(getattr(result, "rowcount", 0) or 0)
