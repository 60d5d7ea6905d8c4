"""A damaged registry or store dir never stops the store nor costs a payload (issue 38 item 1).

The store tests below damage one thing at a time (the SQLite file, one row's values, a payload
file, the registry's rows) and check what a restart makes of it: the integrity check and the
quarantine of the file, rows rebuilt from the payload files' self-describing headers, rows
repaired in place, files moved aside (never deleted), and old files (written before the row
header) still loading and rebuilding.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

import pytest
import safetensors.torch
import torch

from hypic_agent.segments.prompt.keys import token_digest
from hypic_agent.segments.store.disk_tier import DiskTier, checksum_bytes
from hypic_agent.segments.store.headers import record_from_header, row_header
from hypic_agent.segments.store.integrity import RegistryUnavailableError, check_sqlite
from hypic_agent.segments.store.record import EntryRecord
from hypic_agent.segments.store.registry import Registry
from hypic_agent.segments.store.row_decoding import decode_row

from .helpers import FP, FakeClock, key, make_store, meta, payload, same


def _db(tmp_path: Path) -> Path:
    return tmp_path / "registry.sqlite3"


def _sql(db: Path, statement: str, *args: object) -> None:
    con = sqlite3.connect(db)
    con.execute(statement, args)
    con.commit()
    con.close()


def _files(tmp_path: Path) -> dict[str, bytes]:
    root = tmp_path / "store"
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in root.rglob("*.safetensors")
        if "quarantine" not in p.relative_to(root).parts
    }


def _quarantined(tmp_path: Path) -> list[Path]:
    q = tmp_path / "store" / "quarantine"
    return sorted(q.iterdir()) if q.exists() else []


def _filled(tmp_path: Path, clock: FakeClock, n: int = 3):
    s = make_store(tmp_path, clock=clock)
    for i in range(n):
        clock.now += 1
        extra = {"src": f"wiki {i}", "nested": {"i": i}}
        s.put(key(i), payload(i), meta(i, title=f"T{i}", extra=extra, pinned=i == 1, ttl_s=600.0 if i == 2 else None))
    s.close()
    s.registry.close()  # a clean shutdown: the WAL is checkpointed into the file
    return s


# ---------------------------------------------------------------- the header
def test_row_header_round_trips_every_field_a_row_needs(tmp_path):
    disk = DiskTier(tmp_path, 1 << 20)
    s = make_store(tmp_path / "s")
    s.put(key(3), payload(3), meta(3, title="Three", extra={"a": [1, "\udc80x"]}, pinned=True, ttl_s=60.0))
    e = s._index[key(3)]
    m = meta(3, title="Three", extra={"a": [1, "\udc80x"]}, pinned=True, ttl_s=60.0)
    written = disk.write(key(3), payload(3), row_header(e, m))
    h = disk.inspect(written.location)
    assert h.verified and h.checksum == written.checksum and h.nbytes == e.nbytes == 260
    rec = record_from_header(h, now=5000.0)
    assert (rec.key, rec.tenant, rec.kind, rec.model_fingerprint, rec.n_tokens) == (key(3), "t1", "document", FP, 2)
    assert (rec.token_ids, rec.token_digest) == ((3, 4), token_digest((3, 4)))
    assert (rec.text, rec.title, dict(rec.meta)) == ("doc 3", "Three", {"a": [1, "\udc80x"]})
    assert (rec.pinned, rec.ttl_s, rec.created_at, rec.last_used_at) == (True, 60.0, e.created_at, 5000.0)
    assert (rec.tier, rec.location, rec.checksum, rec.prefill_ms) == ("disk", written.location, h.checksum, 10.0)
    tensors, md = disk.read(written.location, written.checksum)  # still an ordinary safetensors file
    assert same(tensors, payload(3)) and md["key"] == key(3)


def test_decoder_never_raises_and_names_what_was_bad():
    raw = {
        "seq": 7, "key": "k", "tenant": "t", "kind": "document", "n_tokens": "three", "model_fingerprint": "fp",
        "nbytes": -1, "tier": "attic", "location": "ab/x.safetensors", "checksum": 5, "created_at": "yesterday",
        "last_used_at": float("nan"), "hits": 1.5, "pinned": "yes", "ttl_s": -3.0, "prefill_ms": "fast",
        "state": "lost", "token_digest": None, "token_ids": b"\x01\x02\x03", "text": b"\xff\xfeok", "title": None,
        "meta": "{not json",
    }  # fmt: skip
    rec = decode_row(raw)
    assert set(rec.damaged) == {
        "n_tokens", "nbytes", "tier", "checksum", "created_at", "last_used_at", "hits", "pinned", "ttl_s",
        "prefill_ms", "state", "token_ids", "meta",
    }  # fmt: skip
    assert (rec.key, rec.seq, rec.n_tokens, rec.nbytes, rec.hits, rec.pinned, rec.ttl_s) == (
        "k",
        7,
        0,
        0,
        0,
        False,
        None,
    )
    assert (rec.tier, rec.location, rec.checksum, rec.state) == ("none", None, None, "ready")  # where: unknown
    assert (rec.created_at, rec.last_used_at, rec.token_ids, dict(rec.meta)) == (0.0, 0.0, None, {})
    assert rec.text == "\ufffd\ufffdok"
    assert "key" in decode_row({**raw, "key": b"\x00"}).damaged  # a key is never taken from a blob


# ---------------------------------------------------------------- the SQLite file
@pytest.mark.parametrize("damage", ["zeroed_header", "half_cut", "not_a_database"])
def test_damaged_file_is_quarantined_salvaged_and_rebuilt(tmp_path, damage, caplog):
    clock = FakeClock()
    _filled(tmp_path, clock)
    s = make_store(tmp_path, clock=clock)
    s.register(key(9), meta(9))  # a definition: no payload file to rebuild it from
    assert s.get(key(0)) is not None and s.get(key(0)) is not None
    s.flush()
    s.registry.close()
    before = _files(tmp_path)
    db = _db(tmp_path)
    data = bytearray(db.read_bytes())
    if damage == "zeroed_header":
        data[:100] = bytes(100)
    elif damage == "half_cut":
        data = data[: len(data) // 2]
    else:
        data = bytearray(b"this is not a database" * 300)
    db.write_bytes(bytes(data))

    with caplog.at_level("WARNING", logger="hypic_agent.segments"):
        s = make_store(tmp_path, clock=clock, registry=Registry(f"sqlite:///{db}"))
    q = s.registry.quarantined
    assert q is not None and q.moved[0].read_bytes() == bytes(data)  # kept as found
    assert q.moved[0].parent == tmp_path / "quarantine"
    assert any(
        "failed its integrity check" in r.getMessage() and str(q.moved[0]) in r.getMessage() for r in caplog.records
    )
    assert check_sqlite(db) is None  # a fresh, sound file
    assert _files(tmp_path) == before and not _quarantined(tmp_path)
    for i in range(3):
        tensors, tier = s.get(key(i))
        assert tier == "disk" and same(tensors, payload(i))
        rec = s.info(key(i))
        assert (rec.token_ids, rec.text, rec.title, rec.meta["src"]) == ((i, i + 1), f"doc {i}", f"T{i}", f"wiki {i}")
    assert s.info(key(1)).pinned and s.info(key(2)).ttl_s == 600.0
    if damage == "zeroed_header":  # every page but the header was readable: the rows themselves came back
        assert len(q.rows) == 4 and not s.recovery.rebuilt
        assert s.info(key(0)).hits == 3 and s.info(key(9)).text == "doc 9"  # what no payload header holds
    elif damage == "not_a_database":
        assert sorted(s.recovery.rebuilt) == sorted(key(i) for i in range(3)) and s.info(key(9)) is None


def test_a_locked_registry_is_not_mistaken_for_a_damaged_one(tmp_path):
    db = tmp_path / "plain.sqlite3"
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("CREATE TABLE t (x)")
    con.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(RegistryUnavailableError, match="locked"):
            check_sqlite(db, timeout_s=0.05)
    finally:
        con.execute("ROLLBACK")
        con.close()
    assert check_sqlite(db) is None and db.exists()


# ---------------------------------------------------------------- rows lost or damaged
def test_emptied_registry_rebuilds_every_row_from_the_headers(tmp_path, caplog):
    clock = FakeClock()
    _filled(tmp_path, clock)
    before = _files(tmp_path)
    _sql(_db(tmp_path), "DELETE FROM hypic_entries")
    clock.now += 10_000  # past the TTL of key(2): a rebuilt row's TTL starts over, it is not expired
    with caplog.at_level("WARNING", logger="hypic_agent.segments"):
        s = make_store(tmp_path, clock=clock)
    assert [r.key for r in s.registry.records()] == [key(0), key(1), key(2)]  # in created_at order
    assert _files(tmp_path) == before and not _quarantined(tmp_path)
    r2 = s.info(key(2))
    assert (r2.ttl_s, r2.last_used_at, r2.hits, r2.tier, r2.created_at) == (600.0, clock.now, 0, "disk", 1003.0)
    assert s.info(key(1)).pinned and s.info(key(0)).meta == {"src": "wiki 0", "nested": {"i": 0}}
    assert all(same(s.get(key(i))[0], payload(i)) for i in range(3))
    assert any("3 rows rebuilt from payload headers" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("meta", "{not json"),
        ("token_ids", b"\x01\x02\x03"),
        ("created_at", "yesterday"),
        ("token_ids", b"\0" * 8),
        ("token_ids", b"\xff" * 8),
    ],
)
def test_a_bad_value_is_repaired_from_its_file_header(tmp_path, column, value):
    clock = FakeClock()
    _filled(tmp_path, clock)
    want = Registry(f"sqlite:///{_db(tmp_path)}").get(key(1))
    _sql(_db(tmp_path), f"UPDATE hypic_entries SET {column} = ? WHERE key = ?", value, key(1))
    s = make_store(tmp_path, clock=clock)
    assert list(s.recovery.repaired) == [key(1)] and not s.recovery.rebuilt
    got = s.registry.get(key(1))
    assert got is not None and not got.damaged
    assert (got.meta, got.token_ids, got.created_at, got.seq) == (want.meta, want.token_ids, want.created_at, want.seq)
    assert same(s.get(key(1))[0], payload(1))


def test_bad_values_of_a_row_without_a_file_get_defaults_and_never_fail_a_listing(tmp_path):
    clock = FakeClock()
    s = make_store(tmp_path, clock=clock)
    s.register(key(9), meta(9, extra={"a": 1}))
    s.put(key(1), payload(1), meta(1))
    _sql(
        _db(tmp_path),
        "UPDATE hypic_entries SET meta = 'nope', created_at = 'x', last_used_at = 'y' WHERE key = ?",
        key(9),
    )
    _sql(_db(tmp_path), "UPDATE hypic_entries SET token_ids = x'0102' WHERE key = ?", key(1))
    clock.now = 2000.0
    page = s.list_entries("t1")  # damaged while running: repaired on the way out
    assert [r.key for r in page.items] == [key(1), key(9)] and not any(r.damaged for r in page.items)
    r9 = s.info(key(9))  # the times from the store's live index, the metadata lost: {}
    assert (dict(r9.meta), r9.created_at, r9.last_used_at, r9.text) == ({}, 1000.0, 1000.0, "doc 9")
    assert s.info(key(1)).token_ids == (1, 2)  # from the payload file's header
    assert s.registry.get(key(9)).damaged == () and s.registry.get(key(1)).damaged == ()  # written back


def test_a_row_whose_key_is_lost_is_quarantined_and_rebuilt_from_its_file(tmp_path):
    clock = FakeClock()
    _filled(tmp_path, clock)
    _sql(_db(tmp_path), "UPDATE hypic_entries SET key = x'00ff' WHERE key = ?", key(0))
    s = make_store(tmp_path, clock=clock)
    assert s.recovery.quarantined_rows == 1 and s.recovery.rebuilt == [key(0)]
    lines = s.recovery.rows_file.read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["key"] == {"base64": "AP8="}
    assert s.info(key(0)).text == "doc 0" and same(s.get(key(0))[0], payload(0))
    assert s.registry.count() == 3


def test_a_published_file_of_a_writing_row_is_given_back(tmp_path):
    """A crash between the file's rename and the row's update: the old code removed the file."""
    clock = FakeClock()
    _filled(tmp_path, clock)
    reg = Registry(f"sqlite:///{_db(tmp_path)}")
    reg.set_location(key(0), tier="none", location=None, checksum=None, state="writing")
    reg.close()
    s = make_store(tmp_path, clock=clock)
    assert s.recovery.adopted == [key(0)]
    rec = s.info(key(0))
    assert (rec.tier, rec.state, rec.hits) == ("disk", "ready", 0) and same(s.get(key(0))[0], payload(0))


def test_stale_and_unreadable_files_are_quarantined_never_deleted(tmp_path):
    clock = FakeClock()
    _filled(tmp_path, clock)
    root = tmp_path / "store"
    loc = Registry(f"sqlite:///{_db(tmp_path)}").get(key(0)).location
    stale = root / loc.replace(".safetensors", "0.safetensors")
    stale.write_bytes((root / loc).read_bytes())  # a second copy of key 0
    junk = root / "zz" / f"{'z' * 32}.abc.safetensors"
    junk.parent.mkdir()
    junk.write_bytes(b"\0" * 100)
    s = make_store(tmp_path, clock=clock)
    moved = _quarantined(tmp_path)
    assert len(moved) == 2 and not stale.exists() and not junk.exists()
    assert sorted(p.read_bytes() for p in moved) == sorted([b"\0" * 100, (root / loc).read_bytes()])
    assert all(p.name.endswith(".quarantined") for p in moved)
    assert s.info(key(0)).location == loc and same(s.get(key(0))[0], payload(0))
    s.close()
    assert len(_quarantined(tmp_path)) == 2  # quarantined files are never scanned again


def test_expired_rows_still_go_with_their_files(tmp_path):
    clock = FakeClock()
    _filled(tmp_path, clock)
    loc = Registry(f"sqlite:///{_db(tmp_path)}").get(key(2)).location
    clock.now += 10_000
    s = make_store(tmp_path, clock=clock)
    assert s.info(key(2)) is None and not (tmp_path / "store" / loc).exists() and not _quarantined(tmp_path)
    assert s.recovery.expired == 1 and not s.recovery.rebuilt


# ---------------------------------------------------------------- payload files
def test_a_damaged_row_checksum_is_corrected_from_the_intact_file(tmp_path):
    clock = FakeClock()
    _filled(tmp_path, clock)
    _sql(_db(tmp_path), "UPDATE hypic_entries SET checksum = ? WHERE key = ?", "0" * 32, key(0))
    s = make_store(tmp_path, clock=clock)
    tensors, tier = s.get(key(0))
    assert tier == "disk" and same(tensors, payload(0)) and s.stats().corrupt == 0
    assert s.registry.get(key(0)).checksum == checksum_bytes(
        (tmp_path / "store" / s.info(key(0)).location).read_bytes()
    )


def test_a_corrupt_payload_is_quarantined_not_deleted(tmp_path):
    clock = FakeClock()
    _filled(tmp_path, clock)
    s = make_store(tmp_path, clock=clock)
    path = s.disk.path(s.info(key(0)).location)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    assert s.get(key(0)) is None and s.stats().corrupt == 1
    [moved] = _quarantined(tmp_path)
    assert moved.read_bytes() == bytes(data) and s.info(key(0)).tier == "none"


def test_files_written_before_the_row_header_still_load_and_rebuild(tmp_path):
    """Old files: the header had key, fingerprint, tenant, digest and kind only."""
    clock = FakeClock()
    s = make_store(tmp_path, clock=clock)
    old = {"format": "hypic-entry-1", "key": "", "model_fingerprint": FP, "tenant": "t1", "kind": "memory"}
    with_ids = {**payload(4), "token_ids": torch.tensor([4, 5], dtype=torch.int32)}
    written = {}
    for i, tensors in ((4, with_ids), (5, payload(5))):
        md = {**old, "key": key(i), "token_digest": token_digest((i, i + 1))}
        data = safetensors.torch.save(tensors, metadata=md)
        loc = f"{key(i)[:2]}/{key(i)}.0000old{i}.safetensors"
        s.disk.path(loc).parent.mkdir(parents=True, exist_ok=True)
        s.disk.path(loc).write_bytes(data)
        os.utime(s.disk.path(loc), (1234.0 + i, 1234.0 + i))
        written[i] = (loc, tensors)
        s.registry.upsert(
            EntryRecord(
                key=key(i), tenant="t1", kind="memory", n_tokens=2, model_fingerprint=FP, created_at=1.0,
                last_used_at=1.0, nbytes=8, tier="disk", location=loc, checksum=checksum_bytes(data),
                token_digest=token_digest((i, i + 1)), token_ids=(i, i + 1),
            )
        )  # fmt: skip
    s.close()
    s = make_store(tmp_path, clock=clock)
    assert same(s.get(key(4))[0], with_ids) and same(s.get(key(5))[0], payload(5))  # they load as before
    s.close()
    s.registry.close()
    _sql(_db(tmp_path), "DELETE FROM hypic_entries")
    s = make_store(tmp_path, clock=clock)
    assert sorted(s.recovery.rebuilt) == sorted([key(4), key(5)])
    r4, r5 = s.info(key(4)), s.info(key(5))
    assert (r4.token_ids, r4.n_tokens, r4.kind, r4.created_at, r4.text) == ((4, 5), 2, "memory", 1238.0, None)
    assert (r5.token_ids, r5.n_tokens, r5.created_at) == (None, 0, 1239.0)  # no ids the digest vouches for
    assert same(s.get(key(5))[0], payload(5)) and s.get(key(4))[1] == "disk"


def test_integrity_check_time_is_small(tmp_path):
    """The check reads the whole file once at start: a 20,000-row registry takes well under a second."""
    Registry(f"sqlite:///{_db(tmp_path)}").close()
    con = sqlite3.connect(_db(tmp_path))
    con.executemany(
        "INSERT INTO hypic_entries (key, tenant, kind, n_tokens, model_fingerprint, nbytes, tier, created_at, "
        "last_used_at, hits, pinned, prefill_ms, state, token_ids, text) "
        "VALUES (?, 't1', 'document', 64, ?, 0, 'none', 1.0, 1.0, 0, 0, 0.0, 'ready', ?, ?)",
        [(f"{i:032x}", FP, bytes(256), "x" * 200) for i in range(20_000)],
    )
    con.commit()
    con.close()
    t0 = time.perf_counter()
    assert check_sqlite(_db(tmp_path)) is None
    assert time.perf_counter() - t0 < 3.0
    assert Registry(f"sqlite:///{_db(tmp_path)}").count() == 20_000


def test_lost_rows_are_rebuilt_on_every_backend(registry_url, tmp_path):
    """SQLite and (with HYPIC_TEST_POSTGRES_URL) PostgreSQL: rows gone, files kept -> rows rebuilt."""
    clock = FakeClock()
    s = make_store(tmp_path, clock=clock, registry=Registry(registry_url))
    for i in range(3):
        clock.now += 1
        s.put(key(i), payload(i), meta(i, title=f"T{i}"))
    s.close()
    assert s.registry.delete_many(key(i) for i in range(3)) == 3
    s.registry.close()
    s = make_store(tmp_path, clock=clock, registry=Registry(registry_url))
    assert s.recovery.rebuilt == [key(0), key(1), key(2)] and not _quarantined(tmp_path)
    assert [s.info(key(i)).title for i in range(3)] == ["T0", "T1", "T2"]
    assert all(same(s.get(key(i))[0], payload(i)) for i in range(3))
    s.registry.close()
