"""Start-up integrity of the SQLite registry file: check, quarantine, salvage.

``check_sqlite(path)`` runs ``PRAGMA integrity_check`` (which also replays the WAL) and says what
is wrong, or ``None``. A file that fails (flipped bytes, a cut file, a zeroed header: SQLite's
``CORRUPT`` / ``NOTADB`` errors or a failed check) is moved aside with its ``-wal`` / ``-shm``
into ``<db dir>/quarantine/`` (never deleted); ``salvage`` then reads what rows it still can from
a temporary copy of it (the quarantined files stay byte for byte as they were found) and the
registry starts over from a fresh file holding those rows. Rows the salvage could not read are
rebuilt from the payload files' headers by recovery (``recovery.py``). Errors that say nothing
about the file's bytes (locked, unreadable folder, permissions) are raised as they are: a
healthy registry is never moved aside because another process holds it.
"""

from __future__ import annotations

import logging
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("hypic_agent.segments.store.registry")

QUARANTINE_DIR = "quarantine"
_SIDE_FILES = ("-wal", "-shm", "-journal")
_CORRUPT_CODES = {"SQLITE_CORRUPT", "SQLITE_NOTADB"}
MAX_PROBES = 200_000
"""Row ids probed one by one past the first unreadable page of a damaged table."""


class RegistryUnavailableError(RuntimeError):
    """The registry file cannot be opened for a reason other than damage (locked, permissions)."""


@dataclass(frozen=True)
class Quarantined:
    """A registry file moved aside: what was wrong, where it went, the rows read back from it."""

    problem: str
    moved: list[Path]
    columns: list[str] = field(default_factory=list)
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    unreadable: bool = False  # the salvage stopped at a page it could not read


def sqlite_path(url: str) -> Path | None:
    """The file of a ``sqlite:///`` URL (``None`` for memory databases and other backends)."""
    if not url.startswith("sqlite") or "///" not in url:
        return None
    path = url.split("///", 1)[1].split("?", 1)[0]
    return None if path in ("", ":memory:") else Path(path)


def stamp() -> str:
    """A UTC time stamp for quarantined names (sortable, unique to the millisecond)."""
    now = time.time()
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z"


def check_sqlite(path: Path, *, timeout_s: float = 30.0) -> str | None:
    """What is wrong with the SQLite file at ``path``, or ``None`` (also for a missing / empty file).

    Raises ``RegistryUnavailableError`` for errors that are not damage to the file."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    try:
        con = sqlite3.connect(path, timeout=timeout_s)
        try:
            rows = con.execute("PRAGMA integrity_check").fetchall()
        finally:
            con.close()
    except sqlite3.DatabaseError as exc:
        if _is_damage(exc):
            return f"{exc} ({getattr(exc, 'sqlite_errorname', type(exc).__name__)})"
        raise RegistryUnavailableError(f"cannot open the registry {path}: {exc}") from exc
    found = [str(r[0]) for r in rows]
    if found != ["ok"]:
        return "integrity_check: " + "; ".join(found[:5]) + (f" (+{len(found) - 5} more)" if len(found) > 5 else "")
    return None


def quarantine_db(path: Path, problem: str, table: str, columns: Sequence[str]) -> Quarantined:
    """Move ``path`` and its side files into ``<dir>/quarantine/``, then salvage ``table``'s rows
    (only ``columns`` that the damaged file has, in this order) from a temporary copy."""
    qdir = path.parent / QUARANTINE_DIR
    qdir.mkdir(parents=True, exist_ok=True)
    base = qdir / f"{path.name}.{stamp()}"
    moved: list[Path] = []
    for suffix in ("", *_SIDE_FILES):
        src = Path(str(path) + suffix)
        if src.exists():
            dst = Path(str(base) + suffix)
            src.replace(dst)
            moved.append(dst)
    cols, rows, unreadable = salvage(base, table, columns)
    return Quarantined(problem=problem, moved=moved, columns=cols, rows=rows, unreadable=unreadable)


def salvage(db: Path, table: str, columns: Sequence[str]) -> tuple[list[str], list[tuple[Any, ...]], bool]:
    """Rows of ``table`` still readable from the (damaged) database ``db``: a scan in row id
    order, then, past the first page that fails, each row id up to the largest one probed alone.
    Reads a temporary copy, so ``db`` itself is left untouched. Returns (columns, rows, whether
    something could not be read)."""
    with tempfile.TemporaryDirectory(prefix="hypic-salvage-") as tmp:
        copy = Path(tmp) / "db.sqlite3"
        for suffix in ("", "-wal"):
            src = Path(str(db) + suffix)
            if src.exists():
                shutil.copyfile(src, Path(str(copy) + suffix))
        _pad_cut_file(copy)
        for _ in _header_guesses(copy):
            try:
                con = sqlite3.connect(copy)
            except sqlite3.DatabaseError:
                continue
            con.text_factory = lenient_text
            try:
                cols, rows, unreadable = _read_rows(con, table, columns)
            finally:
                con.close()
            if cols:
                return cols, rows, unreadable
        return [], [], True


def _read_rows(con: sqlite3.Connection, table: str, columns: Sequence[str]) -> tuple[list[str], list[Any], bool]:
    try:
        have = {str(r[1]) for r in con.execute(f"PRAGMA table_info({table})")}
    except sqlite3.DatabaseError:
        return [], [], True
    cols = [c for c in columns if c in have]
    if "seq" not in cols or "key" not in cols:
        return [], [], bool(have)
    sel = f"SELECT {', '.join(cols)} FROM {table}"  # names: our own columns
    rows: dict[int, tuple[Any, ...]] = {}
    last = 0
    try:
        for row in con.execute(f"{sel} ORDER BY seq"):
            rows[int(row[0])] = row
            last = max(last, int(row[0]))
        return cols, list(rows.values()), False
    except sqlite3.DatabaseError:
        pass
    try:
        top = int(con.execute(f"SELECT max(seq) FROM {table}").fetchone()[0] or 0)
    except (sqlite3.DatabaseError, TypeError, ValueError):
        top = last + MAX_PROBES
    for seq in range(last + 1, min(top, last + MAX_PROBES) + 1):
        try:
            row = con.execute(f"{sel} WHERE seq = ?", (seq,)).fetchone()
        except sqlite3.DatabaseError:
            continue
        if row is not None:
            rows[seq] = row
    return cols, [rows[k] for k in sorted(rows)], True


_MAGIC = b"SQLite format 3\x00"


def _header_guesses(path: Path) -> Iterator[None]:
    """Yield once as the file is; if its 100-byte header is not SQLite's (zeroed, overwritten),
    yield again after each rewrite of it with a page size that divides the file (the header holds
    nothing a read-only scan needs beyond the page size and count)."""
    yield
    with open(path, "r+b") as f:
        head = f.read(100)
        size = f.seek(0, 2)
        if head.startswith(_MAGIC):
            return
        for page in (4096, 1024, 2048, 8192, 16384, 32768, 65536):
            if size < page or size % page:
                continue
            f.seek(0)
            f.write(_header(page, size // page))
            f.flush()
            yield


def _header(page: int, pages: int) -> bytes:
    h = bytearray(100)
    h[:16] = _MAGIC
    h[16:18] = (1 if page == 65536 else page).to_bytes(2, "big")
    h[18], h[19], h[21], h[22], h[23] = 1, 1, 64, 32, 32  # legacy journal, payload fractions
    h[24:28] = (1).to_bytes(4, "big")  # change counter, equal to "version valid for" below
    h[28:32] = pages.to_bytes(4, "big")
    h[44:48] = (4).to_bytes(4, "big")  # schema format
    h[56:60] = (1).to_bytes(4, "big")  # UTF-8
    h[92:96] = (1).to_bytes(4, "big")
    h[96:100] = (3_040_000).to_bytes(4, "big")
    return bytes(h)


def _pad_cut_file(path: Path) -> None:
    """A cut file is shorter than its header's page count, and SQLite then reads none of it: pad
    the copy with zero pages so that the pages before the cut can be read."""
    with open(path, "r+b") as f:
        head = f.read(100)
        if len(head) < 100 or not head.startswith(b"SQLite format 3\x00"):
            return
        page = int.from_bytes(head[16:18], "big")
        page = 65536 if page == 1 else page
        want = page * int.from_bytes(head[28:32], "big")
        size = f.seek(0, 2)
        if page >= 512 and size < want <= size + (1 << 30):
            f.truncate(want)


def lenient_text(data: bytes) -> str:
    """SQLite ``TEXT`` as ``str`` even when its bytes are not UTF-8 (a flipped byte must not make
    the whole query fail; the value is then checked like any other)."""
    return data.decode("utf-8", "replace")


def _is_damage(exc: sqlite3.DatabaseError) -> bool:
    name = str(getattr(exc, "sqlite_errorname", "") or "")
    if any(name.startswith(code) for code in _CORRUPT_CODES):
        return True
    msg = str(exc).lower()
    return "malformed" in msg or "not a database" in msg
