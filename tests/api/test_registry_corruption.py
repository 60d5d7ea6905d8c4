"""Issue 38 item 1: a damaged registry never stops the server nor costs a stored entry.

Each test stores three documents through the API, damages the registry the way a disk, a crash
or a person would (flipped bytes, a cut file, a zeroed first page, ``meta`` that is not JSON, a
lost or damaged WAL, an emptied or deleted registry, a bad ``token_ids`` blob, a bad
``created_at``), starts a new app over the same home, and checks that it starts, that every
acknowledged id answers GET / list / PATCH / generate with its tokens, title and metadata, served
from its payload file (a hit, the same answer as before), and that no payload file was deleted.
"""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from hypic_agent.api import create_app
from hypic_agent.config import Settings
from tests.api.conftest import BERLIN, PARIS, ROME, TINY, doc, state

DOCS = [
    doc(PARIS, "Paris", metadata={"src": "wiki", "n": 1}),
    doc(BERLIN, "Berlin", cache={"pin": True}),
    doc(ROME, "Rome", metadata={"tags": ["old", "city"]}),
]
ASK = {"query": "Which city?", "max_tokens": 4}


@pytest.fixture
def boot(engine: Any) -> Iterator[Callable[..., TestClient]]:
    """``boot(home)``: an app over ``home`` (lifespan entered); every one is shut down at the end."""
    up: list[TestClient] = []

    def make(home: Path, **overrides: Any) -> TestClient:
        settings = Settings(home=home, device="cpu", model=TINY, **overrides)
        client = TestClient(create_app(settings, engine=engine), raise_server_exceptions=False)
        client.__enter__()
        up.append(client)
        return client

    yield make
    for c in up:
        c.__exit__(None, None, None)


def _generate(c: TestClient, seg_id: str) -> dict[str, Any]:
    r = c.post("/v1/generate", json={"segments": [{"id": seg_id}], **ASK})
    assert r.status_code == 200, r.text
    body = r.json()
    return {"text": body["text"], **body["usage"]["segments"][0]}


def _payloads(home: Path) -> set[str]:
    root = home / "store"
    return {p.relative_to(root).as_posix() for p in root.rglob("*.safetensors") if "quarantine" not in p.parts}


def _fill(c: TestClient) -> dict[str, dict[str, Any]]:
    r = c.put("/v1/segments", json={"segments": DOCS})
    assert r.status_code == 200, r.text
    stored = {d["id"]: d for d in r.json()["data"]}
    assert len(stored) == 3 and all(d["tier"] in ("cpu", "disk") and d["bytes"] > 0 for d in stored.values())
    for seg_id, d in stored.items():
        d["answer"] = _generate(c, seg_id)["text"]
        d["text"] = c.get(f"/v1/segments/{seg_id}").json()["text"]
    return stored


def _sql(db: Path, statement: str, *args: Any) -> None:
    con = sqlite3.connect(db)
    con.execute(statement, args)
    con.commit()
    con.close()


def _assert_all_served(c: TestClient, stored: dict[str, dict[str, Any]], before: set[str], home: Path) -> None:
    assert c.get("/health").status_code == 200
    listed = c.get("/v1/segments")
    assert listed.status_code == 200, listed.text
    assert {d["id"] for d in listed.json()["data"]} == set(stored)
    for seg_id, want in stored.items():
        r = c.get(f"/v1/segments/{seg_id}")
        assert r.status_code == 200, r.text
        got = r.json()
        assert got["tier"] == "disk" and got["bytes"] == want["bytes"], got  # its payload file, not a recompute
        assert (got["tokens"], got["title"], got["metadata"], got["text"], got["kind"]) == (
            want["tokens"], want["title"], want["metadata"], want["text"], "document"
        )  # fmt: skip
        assert got["pin"] == want["pin"] and got["created_at"] == pytest.approx(want["created_at"])
        used = _generate(c, seg_id)
        assert used["hit"] is True and used["tier"] == "disk" and used["text"] == want["answer"]
    assert _payloads(home) == before  # nothing deleted, nothing quarantined
    seg_id = next(iter(stored))
    r = c.patch(f"/v1/segments/{seg_id}", json={"cache": {"ttl": 600}})
    assert r.status_code == 200 and r.json()["ttl"] == 600


# ---------------------------------------------------------------- damage to a cleanly closed registry
def _flip(db: Path, at: range) -> None:
    data = bytearray(db.read_bytes())
    for page in range(1, len(data) // 4096):  # every page but the first: rows and indexes
        for off in at:
            data[page * 4096 + off] ^= 0x5A
    db.write_bytes(bytes(data))


def _flip_values(db: Path) -> None:  # inside the rows: SQLite cannot tell, the values are wrong
    _flip(db, range(3000, 3064))


def _flip_pages(db: Path) -> None:  # the b-tree page headers: the integrity check fails
    _flip(db, range(0, 12))


def _half(db: Path) -> None:
    db.write_bytes(db.read_bytes()[: db.stat().st_size // 2])


def _zero_first_page(db: Path) -> None:
    data = bytearray(db.read_bytes())
    data[:4096] = bytes(4096)
    db.write_bytes(bytes(data))


def _meta_not_json(db: Path) -> None:
    _sql(db, "UPDATE hypic_entries SET meta = '{not json'")


def _bad_token_ids(db: Path) -> None:
    _sql(db, "UPDATE hypic_entries SET token_ids = x'0102030405'")


def _bad_created_at(db: Path) -> None:
    _sql(db, "UPDATE hypic_entries SET created_at = 'yesterday', last_used_at = x'00'")


def _emptied(db: Path) -> None:
    _sql(db, "DELETE FROM hypic_entries")


def _deleted(db: Path) -> None:
    db.unlink()


@pytest.mark.parametrize(
    "damage",
    [
        _flip_values,
        _flip_pages,
        _half,
        _zero_first_page,
        _meta_not_json,
        _bad_token_ids,
        _bad_created_at,
        _emptied,
        _deleted,
    ],
    ids=lambda f: f.__name__.strip("_"),
)
def test_damaged_registry_starts_and_serves_every_entry(boot, tmp_path, damage):
    home = tmp_path / "home"
    c = boot(home)
    stored = _fill(c)
    before = _payloads(home)
    assert len(before) == 3
    c.__exit__(None, None, None)  # a clean shutdown: the WAL is checkpointed into the file
    db = home / "registry.sqlite3"
    assert db.exists() and not (home / "registry.sqlite3-wal").exists()
    damage(db)

    c2 = boot(home)
    _assert_all_served(c2, stored, before, home)
    report = state(c2).store.recovery
    if damage in (_meta_not_json, _bad_token_ids, _bad_created_at):
        assert sorted(report.repaired) == sorted(stored) and not report.rebuilt  # fixed in place
    elif damage is _flip_values:
        assert report.damage
    else:
        assert report.rebuilt or report.registry_quarantine  # rebuilt from the files' headers
    if damage in (_flip_pages, _half, _zero_first_page):  # the damaged file is kept, never deleted
        assert report.registry_quarantine and all(p.exists() for p in report.registry_quarantine)
        assert (home / "quarantine").is_dir()


# ---------------------------------------------------------------- a crash image (kill -9) without its WAL
def _crash_image(home: Path, to: Path) -> Path:
    """The home as a ``kill -9`` leaves it: the registry's last commits only in its WAL."""
    shutil.copytree(home, to)
    wal = to / "registry.sqlite3-wal"
    assert wal.exists() and wal.stat().st_size > 0
    return wal


@pytest.mark.parametrize("wal_damage", ["lost", "damaged"])
def test_lost_or_damaged_wal_rebuilds_instead_of_deleting(boot, tmp_path, wal_damage, caplog):
    home = tmp_path / "home"
    c = boot(home)
    stored = _fill(c)
    before = _payloads(home)
    image = tmp_path / "image"
    wal = _crash_image(home, image)
    if wal_damage == "lost":
        wal.unlink()
    else:
        data = bytearray(wal.read_bytes())
        for off in range(32, len(data), 512):  # the WAL header's salts and every frame's checksum area
            data[off] ^= 0xFF
        wal.write_bytes(bytes(data))
    # without its WAL the registry file knows none of the rows: the old code deleted every file here
    con = sqlite3.connect(f"file:{image / 'registry.sqlite3'}?immutable=1", uri=True)
    tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    rows = con.execute("SELECT count(*) FROM hypic_entries").fetchone()[0] if "hypic_entries" in tables else 0
    con.close()
    assert rows < len(stored)

    with caplog.at_level("WARNING", logger="hypic_agent.segments"):
        c2 = boot(image)
    _assert_all_served(c2, stored, before, image)
    assert sorted(state(c2).store.recovery.rebuilt) == sorted(stored)
    assert any("rebuilt from payload headers" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------- damage while the server runs
def test_rows_damaged_while_serving_answer_and_repair(client):
    r = client.put("/v1/segments", json={"segments": DOCS})
    ids = [d["id"] for d in r.json()["data"]]
    short = client.put("/v1/segments", json={"segments": [{"kind": "text", "text": "hi"}]}).json()["data"][0]
    st = state(client)
    st.store.flush()
    db = Path(st.settings.resolved_database_url().split("///", 1)[1])
    _sql(db, "UPDATE hypic_entries SET token_ids = x'010203' WHERE key = ?", ids[0])
    _sql(db, "UPDATE hypic_entries SET created_at = 'yesterday' WHERE key = ?", ids[1])
    _sql(db, "UPDATE hypic_entries SET meta = '[broken' WHERE key IN (?, ?)", ids[2], short["id"])

    listed = client.get("/v1/segments")  # the old code: 500 for the whole tenant
    assert listed.status_code == 200, listed.text
    assert [d["id"] for d in listed.json()["data"]] == [short["id"], *ids[::-1]]
    by_id = {d["id"]: d for d in listed.json()["data"]}
    assert by_id[ids[2]]["metadata"] == {"tags": ["old", "city"]}  # from the payload file's header
    assert by_id[short["id"]]["metadata"] == {}  # no file to repair from: the default, shown
    assert isinstance(by_id[ids[1]]["created_at"], float) and by_id[ids[1]]["created_at"] > 1e9

    got = client.get(f"/v1/segments/{ids[0]}")  # the old code: 500 forever
    assert got.status_code == 200 and got.json()["tokens"] > 0
    assert client.patch(f"/v1/segments/{ids[0]}", json={"cache": {"pin": True}}).json()["pin"] is True
    used = _generate(client, ids[0])
    assert used["hit"] is True and used["id"] == ids[0]
    rec = st.store.info(ids[0])
    assert rec is not None and rec.token_ids is not None and len(rec.token_ids) == got.json()["tokens"]
    assert not rec.damaged and st.store.registry.get(ids[0]).damaged == ()  # written back once
