"""Segment builders and the /v1/segments CRUD endpoints (sync and async) against the fake server."""

from __future__ import annotations

import asyncio

import hypic_client as hc
import pytest
from hypic_client._segments import segments_to_wire
from hypic_fake_server import FakeServer
from pydantic import ValidationError


def test_builders_produce_the_wire_shape():
    assert hc.doc("Paris is...", title="Paris").to_wire() == {
        "kind": "document",
        "text": "Paris is...",
        "title": "Paris",
    }
    assert hc.skill("call get_weather(city)", name="weather", pin=True).to_wire() == {
        "kind": "skill",
        "text": "call get_weather(city)",
        "title": "weather",
        "cache": {"pin": True},
    }
    assert hc.memory("likes tea", ttl=60, metadata={"user": "u1"}).to_wire() == {
        "kind": "memory",
        "text": "likes tea",
        "cache": {"ttl": 60.0},
        "metadata": {"user": "u1"},
    }
    assert hc.system("be brief").to_wire() == {"kind": "system", "text": "be brief"}
    assert hc.text("raw").to_wire() == {"kind": "text", "text": "raw"}
    assert hc.turn("user", "hi").to_wire() == {"kind": "turn", "messages": [{"role": "user", "content": "hi"}]}
    assert hc.ref("abc").to_wire() == {"id": "abc"}


def test_turns_split_one_segment_per_message():
    segs = hc.turns(
        [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "q1"},
            {"role": "assistant", "content": "a1"},
        ]
    )
    assert [s.kind for s in segs] == ["system", "turn", "turn"]
    assert segs[2].messages[0].role == "assistant"


def test_segment_like_inputs_normalize():
    wire = segments_to_wire(["plain", {"kind": "document", "text": "d", "custom": 1}, hc.ref("x")])
    assert wire == [{"kind": "text", "text": "plain"}, {"kind": "document", "text": "d", "custom": 1}, {"id": "x"}]
    assert segments_to_wire(hc.doc("one")) == [{"kind": "document", "text": "one"}]


@pytest.mark.parametrize(
    "bad",
    [{"kind": "document"}, {"kind": "turn", "text": "x"}, {"kind": "video", "text": "x"}],
)
def test_invalid_segments_are_rejected_client_side(bad):
    with pytest.raises(ValidationError):
        segments_to_wire([bad])


def test_builder_type_errors():
    with pytest.raises(TypeError):
        hc.doc(123)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        hc.ref("")
    with pytest.raises(TypeError, match="doc\\(\\)"):
        segments_to_wire([42])  # type: ignore[list-item]


def test_put_get_update_delete(client: hc.Hypic, fake_server: FakeServer):
    infos = client.segments.put([hc.doc("alpha beta gamma", title="A", pin=True), hc.memory("m one")])
    assert [i.kind for i in infos] == ["document", "memory"] and infos[0].tokens == 3
    assert fake_server.last("/v1/segments").body["segments"][0] == {
        "kind": "document",
        "text": "alpha beta gamma",
        "title": "A",
        "cache": {"pin": True},
    }
    assert client.segments.put(hc.doc("alpha beta gamma", title="A"))[0].id == infos[0].id  # content addressed
    got = client.segments.get(infos[0].id)
    assert got.id == infos[0].id and got.pin is True
    updated = client.segments.update(infos[1].id, pin=True, ttl=30)
    assert updated.pin is True and updated.ttl == 30
    assert fake_server.requests[-1].method == "PATCH" and fake_server.requests[-1].body == {
        "cache": {"pin": True, "ttl": 30}
    }
    assert client.segments.delete(infos[1].id).deleted is True
    with pytest.raises(hc.NotFoundError) as ei:
        client.segments.get(infos[1].id)
    assert ei.value.error_type == "segment_not_found"


def test_list_pages_and_iter(client: hc.Hypic, fake_server: FakeServer):
    ids = {i.id for i in client.segments.put([hc.doc(f"doc number {n}") for n in range(5)])}
    page = client.segments.list(limit=2)
    assert len(page) == 2 and page.has_more and page.next == page.data[-1].id
    page2 = client.segments.list(limit=2, after=page.next)
    assert {s.id for s in page2}.isdisjoint({s.id for s in page})
    assert fake_server.requests[-1].params == {"limit": "2", "after": page.next}
    assert {s.id for s in client.segments.iter(limit=2)} == ids


def test_generate_with_refs_reports_cache_hits(client: hc.Hypic, fake_server: FakeServer):
    (stored,) = client.segments.put([hc.doc("Paris is the capital of France.", title="Paris")])
    resp = client.generate([hc.system("Answer briefly."), hc.ref(stored.id)], "Capital of France?", max_tokens=2)
    assert resp.text == "Paris is"
    seg_usage = resp.usage.segments
    assert [(s.kind, s.hit) for s in seg_usage] == [("system", False), ("document", True)]
    assert resp.usage.cached_tokens == stored.tokens == 6
    assert resp.usage.cached_tokens + resp.usage.recomputed_tokens == resp.usage.prompt_tokens
    with pytest.raises(hc.NotFoundError, match="PUT it first"):
        client.generate([hc.ref("missing")], "q")


def test_async_crud(fake_server: FakeServer):
    async def go():
        async with hc.AsyncHypic("http://hypic.test", transport=fake_server.transport) as c:
            infos = await c.segments.put([hc.doc(f"d {i}") for i in range(3)])
            got = await c.segments.get(infos[0].id)
            page = await c.segments.list(limit=2)
            every = [s.id async for s in c.segments.iter(limit=1)]
            upd = await c.segments.update(infos[0].id, ttl=5)
            gone = await c.segments.delete(infos[0].id)
            try:
                await c.segments.get(infos[0].id)
            except hc.NotFoundError:
                missing = True
            return infos, got, page, every, upd, gone, missing

    infos, got, page, every, upd, gone, missing = asyncio.run(go())
    assert got.id == infos[0].id and page.has_more and sorted(every) == sorted(i.id for i in infos)
    assert upd.ttl == 5 and gone.deleted and missing
