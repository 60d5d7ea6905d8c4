"""Registry rows outlive payloads (issue 22): an evicted or corrupt entry keeps its id, GET says
``tier: none`` and the next request that uses the id rebuilds it."""

from __future__ import annotations

from pathlib import Path

from tests.api.conftest import BERLIN, PARIS, doc, state

ONE_ENTRY = 120_000  # a tiny-model entry of these documents is ~80 kB: each tier holds one


def _use(client, seg_id: str) -> dict:
    r = client.post("/v1/generate", json={"segments": [{"id": seg_id}], "query": "q", "max_tokens": 1})
    assert r.status_code == 200, r.text
    return r.json()["usage"]["segments"][0]


def test_evicted_id_answers_get_and_is_rebuilt_on_use(make_client):
    c = make_client(cpu_budget_bytes=ONE_ENTRY, disk_budget_bytes=ONE_ENTRY)
    [a] = c.put("/v1/segments", json={"segments": [doc(PARIS, "Paris", metadata={"src": "wiki"})]}).json()["data"]
    [b] = c.put("/v1/segments", json={"segments": [doc(BERLIN)]}).json()["data"]
    assert a["tier"] in ("cpu", "disk") and b["tier"] in ("cpu", "disk")
    assert state(c).store.stats().evicted == 1  # Paris left every tier to make room for Berlin

    r = c.get(f"/v1/segments/{a['id']}")
    assert r.status_code == 200
    got = r.json()
    assert (got["tier"], got["bytes"], got["title"], got["metadata"]) == ("none", a["bytes"], "Paris", {"src": "wiki"})
    assert PARIS in got["text"] and got["tokens"] == a["tokens"]
    assert [d["id"] for d in c.get("/v1/segments").json()["data"]] == [b["id"], a["id"]]

    seg = _use(c, a["id"])  # rebuilt from the row's tokens: a miss, then stored again
    assert seg["id"] == a["id"] and seg["hit"] is False
    again = c.get(f"/v1/segments/{a['id']}").json()
    assert again["tier"] != "none" and again["bytes"] > 0 and again["created_at"] == got["created_at"]
    assert _use(c, a["id"])["hit"] is True


def test_corrupt_entry_is_rebuilt_on_use(make_client):
    c = make_client(cpu_budget_bytes=0)  # disk only: every use reads (and checks) the file
    [a] = c.put("/v1/segments", json={"segments": [doc(PARIS)]}).json()["data"]
    assert a["tier"] == "disk"
    st = state(c)
    path = Path(st.settings.resolved_store_dir()) / st.store.info(a["id"]).location
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))

    seg = _use(c, a["id"])  # the damaged payload is never served: recomputed, stored again
    assert seg["hit"] is False and st.store.stats().corrupt == 1
    rec = st.store.info(a["id"])
    assert rec.tier == "disk" and (Path(st.settings.resolved_store_dir()) / rec.location).exists()
    r = c.get(f"/v1/segments/{a['id']}")
    assert r.status_code == 200 and r.json()["tier"] == "disk"
    seg = _use(c, a["id"])
    assert seg["hit"] is True and seg["tier"] == "disk"
