"""Request and connection limits (issue 38, item 3): stored bytes per request and per tenant-minute,
request bodies held at once, body read timeout; slow headers and the connection cap on a real
uvicorn server over raw sockets."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from hypic_agent.api import create_app
from hypic_agent.api.limits import EntrySize
from hypic_agent.api.middleware import BodyLimitMiddleware, InflightBytes
from hypic_agent.api.serve import uvicorn_config
from hypic_agent.config import Settings
from tests.api.conftest import BERLIN, PARIS, ROME, TINY, doc, err, state, store_snapshot

KEYS = {"key-alice-000": "alice", "key-bob-000": "bob"}
A = {"Authorization": "Bearer key-alice-000"}
B = {"Authorization": "Bearer key-bob-000"}


def _tokens(c: Any, text: str) -> int:
    """Tokens of ``text`` as a stored document (PUT on a throw-away client)."""
    r = c.put("/v1/segments", json={"segments": [doc(text)]})
    assert r.status_code == 200, r.text
    return r.json()["data"][0]["tokens"]


def test_entry_size_estimate_is_what_the_store_holds(make_client, engine):
    c = make_client()
    size = state(c).store_budget.size
    assert size == EntrySize.of_model(engine.model, engine.cold.pair_dtype)
    for text in (PARIS, PARIS + " " + BERLIN + " " + ROME):
        [info] = c.put("/v1/segments", json={"segments": [doc(text)]}).json()["data"]
        assert info["bytes"] == size.of(info["tokens"]), info  # the estimate is the stored payload, exactly


def test_prompt_over_the_request_cap_is_413_and_stores_nothing(make_client):
    probe = make_client()
    size = state(probe).store_budget.size
    n_paris, n_berlin = _tokens(probe, PARIS), _tokens(probe, BERLIN)
    cap = size.of(n_paris) + size.of(n_berlin) // 2  # one document fits, two do not
    c = make_client(max_request_store_bytes=cap)
    before = store_snapshot(c)
    body = {"segments": [doc(PARIS), doc(BERLIN)], "query": "Which capital?", "max_tokens": 1}
    r = c.post("/v1/generate", json=body)
    assert r.status_code == 413, r.text
    e = err(r)
    assert e["type"] == "store_limit_exceeded" and e["param"] == "segments"
    assert "2 new cache entries" in e["message"] and "HYPIC_MAX_REQUEST_STORE_BYTES" in e["message"]
    assert store_snapshot(c) == before  # nothing built, nothing stored
    r = c.post("/v1/generate", json={**body, "segments": [doc(PARIS)]})
    assert r.status_code == 200, r.text
    # the same prompt again: PARIS is stored, only BERLIN is new, so it fits now
    r = c.post("/v1/generate", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["segments"][0]["hit"] is True
    # a mode that stores nothing is never refused
    r = c.post("/v1/generate", json={**body, "segments": [doc(ROME), doc(BERLIN + " again")], "mode": "full_recompute"})
    assert r.status_code == 200, r.text


def test_tenant_store_bytes_per_minute_is_429_then_passes(make_client):
    probe = make_client()
    size = state(probe).store_budget.size
    per_doc = max(size.of(_tokens(probe, t)) for t in (PARIS, BERLIN, ROME))
    c = make_client(api_keys=KEYS, tenant_store_bytes_per_minute=int(per_doc * 2.5))
    budget = state(c).store_budget
    now = [5000.0]
    budget.clock = lambda: now[0]

    def gen(text: str, headers: dict[str, str]) -> Any:
        return c.post("/v1/generate", json={"segments": [doc(text)], "query": "q", "max_tokens": 1}, headers=headers)

    assert gen(PARIS, A).status_code == 200 and gen(BERLIN, A).status_code == 200
    before = store_snapshot(c)
    r = gen(ROME, A)
    assert r.status_code == 429, r.text
    e = err(r)
    assert e["type"] == "store_rate_limited" and "HYPIC_TENANT_STORE_BYTES_PER_MINUTE" in e["message"]
    assert 1 <= int(r.headers["retry-after"]) <= 60
    assert store_snapshot(c) == before
    assert gen(PARIS, A).status_code == 200  # nothing new: never refused
    assert gen(ROME, B).status_code == 200  # bob has his own minute
    now[0] += 61
    assert gen(ROME, A).status_code == 200  # alice's minute has passed


def test_put_over_the_request_cap_is_413_and_stores_nothing(make_client):
    probe = make_client()
    size = state(probe).store_budget.size
    cap = size.of(_tokens(probe, PARIS)) + size.of(_tokens(probe, BERLIN)) // 2
    c = make_client(max_request_store_bytes=cap)
    assert state(c).admit_put([], "hypic", 8.0, "default") == 0
    before = store_snapshot(c)
    r = c.put("/v1/segments", json={"segments": [doc(PARIS), doc(BERLIN)]})
    assert r.status_code == 413, r.text
    e = err(r)
    assert e["type"] == "store_limit_exceeded" and e["param"] == "segments"
    assert "2 new cache entries" in e["message"] and "HYPIC_MAX_REQUEST_STORE_BYTES" in e["message"]
    assert store_snapshot(c) == before  # no row, no payload
    assert c.put("/v1/segments", json={"segments": [doc(PARIS)]}).status_code == 200
    r = c.put("/v1/segments", json={"segments": [doc(PARIS), doc(BERLIN)]})  # PARIS is stored: BERLIN alone fits
    assert r.status_code == 200, r.text
    assert [d["hit"] for d in r.json()["data"]] == [True, False]


def test_put_over_the_tenant_minute_is_429(make_client):
    probe = make_client()
    size = state(probe).store_budget.size
    per_doc = max(size.of(_tokens(probe, t)) for t in (PARIS, BERLIN))
    c = make_client(tenant_store_bytes_per_minute=int(per_doc * 1.5))
    assert c.put("/v1/segments", json={"segments": [doc(PARIS)]}).status_code == 200
    before = store_snapshot(c)
    r = c.put("/v1/segments", json={"segments": [doc(BERLIN)]})
    assert r.status_code == 429 and err(r)["type"] == "store_rate_limited", r.text
    assert 1 <= int(r.headers["retry-after"]) <= 60
    assert store_snapshot(c) == before


CHAT_Q = {"messages": [{"role": "user", "content": "Which capital?"}], "max_tokens": 1}
COMPLETION_Q = {"prompt": "Which capital?", "max_tokens": 1}


@pytest.mark.parametrize(("path", "body"), [("/v1/chat/completions", CHAT_Q), ("/v1/completions", COMPLETION_Q)])
def test_openai_routes_over_the_request_cap_are_413_and_store_nothing(make_client, path, body):
    probe = make_client()
    size = state(probe).store_budget.size
    cap = size.of(_tokens(probe, PARIS)) + size.of(_tokens(probe, BERLIN)) // 2  # one document fits, two do not
    c = make_client(max_request_store_bytes=cap)
    before = store_snapshot(c)
    r = c.post(path, json={**body, "segments": [doc(PARIS), doc(BERLIN)]})
    assert r.status_code == 413, r.text
    e = err(r)
    assert e["type"] == "store_limit_exceeded" and e["param"] == "segments"
    assert "2 new cache entries" in e["message"] and "HYPIC_MAX_REQUEST_STORE_BYTES" in e["message"]
    assert store_snapshot(c) == before  # nothing built, nothing stored
    r = c.post(path, json={**body, "segments": [doc(PARIS)]})
    assert r.status_code == 200, r.text
    assert store_snapshot(c)["entries"] == 1
    r = c.post(path, json={**body, "segments": [doc(PARIS), doc(BERLIN)]})  # only BERLIN is new now: fits
    assert r.status_code == 200, r.text
    assert store_snapshot(c)["entries"] == 2


# --------------------------------------------------------------------------- bodies (ASGI)


def _scope(length: int | None, method: str = "POST") -> dict[str, Any]:
    headers = [] if length is None else [(b"content-length", str(length).encode())]
    return {"type": "http", "method": method, "path": "/v1/generate", "headers": headers}


async def _call(mw: Any, scope: dict[str, Any], chunks: list[bytes], complete: bool = True) -> list[dict[str, Any]]:
    """Run ``mw`` on one request whose body comes as ``chunks`` (and no more, unless ``complete``)."""
    sent: list[dict[str, Any]] = []
    queue = list(chunks)

    async def receive() -> dict[str, Any]:
        if not queue:
            await asyncio.Event().wait()  # a client that sends nothing more
        body = queue.pop(0)
        return {"type": "http.request", "body": body, "more_body": bool(queue) or not complete}

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg)

    await mw(scope, receive, send)
    return sent


def test_bodies_held_at_once_are_bounded():
    from starlette.exceptions import HTTPException

    gate = asyncio.Event()
    reading = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        reading.set()
        if scope["path"] == "/v1/generate":
            await gate.wait()  # this request holds its body until the gate opens
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    inflight = InflightBytes(1000)
    mw = BodyLimitMiddleware(app, max_bytes=10_000, inflight=inflight)

    async def run() -> None:
        first = asyncio.ensure_future(_call(mw, _scope(600), [b"x" * 600]))
        await reading.wait()
        assert inflight.held == 600
        refused = await _call(mw, _scope(600), [b"y" * 600])
        assert refused[0]["status"] == 503 and (b"retry-after", b"1") in refused[0]["headers"]
        body = json.loads(refused[1]["body"])
        assert body["error"]["type"] == "overloaded" and "HYPIC_MAX_INFLIGHT_BODY_BYTES" in body["error"]["message"]
        small = await _call(mw, {**_scope(300), "path": "/small"}, [b"z" * 300])  # fits beside the first
        assert small[0]["status"] == 200
        with pytest.raises(HTTPException) as info:  # a chunked body is held as it comes: refused mid-way
            await _call(mw, {**_scope(None), "path": "/small"}, [b"c" * 300, b"c" * 300])
        assert info.value.status_code == 503 and info.value.headers == {"Retry-After": "1"}
        assert inflight.held == 600
        gate.set()
        assert (await first)[0]["status"] == 200
        assert inflight.held == 0  # released once answered
        alone = await _call(mw, {**_scope(5000), "path": "/big"}, [b"w" * 5000])  # nothing held: let in
        assert alone[0]["status"] == 200 and inflight.held == 0
        chunked = await _call(mw, {**_scope(None), "path": "/big"}, [b"v" * 700] * 4)  # alone, chunk by chunk
        assert chunked[0]["status"] == 200 and inflight.held == 0

    asyncio.run(run())


def test_a_body_that_stops_arriving_is_408_with_connection_close():
    from starlette.exceptions import HTTPException

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass

    mw = BodyLimitMiddleware(app, max_bytes=10_000, timeout_s=0.05)
    with pytest.raises(HTTPException) as info:
        asyncio.run(_call(mw, _scope(100), [b"x" * 10, b"y" * 10], complete=False))
    assert info.value.status_code == 408 and info.value.headers == {"Connection": "close"}
    assert "HYPIC_BODY_TIMEOUT_S" in info.value.detail and "20 bytes came" in info.value.detail


# --------------------------------------------------------------------------- a real server, raw sockets


@contextlib.contextmanager
def serving(engine: Any, tmp_path: Any, **overrides: Any) -> Iterator[int]:
    import uvicorn

    settings = Settings(home=tmp_path / "srv", device="cpu", model=TINY, **overrides)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(
        uvicorn_config(create_app(settings, engine=engine), settings, port=port, log_level="warning")
    )
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            assert time.monotonic() < deadline and th.is_alive(), "server did not start"
            time.sleep(0.05)
        yield port
    finally:
        server.should_exit = True
        th.join(20)


def _read_response(sock: socket.socket) -> tuple[bytes, dict[str, Any]]:
    """One whole response: its head and its JSON body."""
    sock.settimeout(30)
    got = b""
    while b"\r\n\r\n" not in got:
        data = sock.recv(65536)
        assert data, got
        got += data
    head, body = got.split(b"\r\n\r\n", 1)
    length = int(
        next(v for k, v in (h.split(b": ", 1) for h in head.split(b"\r\n")[1:]) if k.lower() == b"content-length")
    )
    while len(body) < length:
        data = sock.recv(65536)
        assert data, got
        body += data
    return head, json.loads(body)


def _trickle_until_closed(sock: socket.socket, start: bytes, more: bytes, limit_s: float) -> tuple[bytes, bool]:
    """Send ``start``, then ``more`` every 0.1 s; everything the server answered, and whether it closed
    the connection within ``limit_s``."""
    sock.sendall(start)
    sock.settimeout(0.1)
    got = b""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            data = sock.recv(65536)
        except TimeoutError:
            data = None
        except (ConnectionResetError, BrokenPipeError):
            return got, True
        if data == b"":
            return got, True
        if data:
            got += data
        try:
            sock.sendall(more)
        except (ConnectionResetError, BrokenPipeError):
            return got, True
    return got, False


def test_slow_headers_and_slow_bodies_are_closed(engine, tmp_path):
    with serving(engine, tmp_path, header_timeout_s=1.0, body_timeout_s=1.0) as port:
        # headers that never end: a header line every 0.1 s
        with socket.create_connection(("127.0.0.1", port)) as sock:
            got, closed = _trickle_until_closed(sock, b"GET /health HTTP/1.1\r\nHost: x\r\n", b"X-A: b\r\n", 30)
        assert closed, "a connection sending headers forever was not closed"
        assert got.startswith(b"HTTP/1.1 408"), got
        assert json.loads(got.split(b"\r\n\r\n", 1)[1])["error"]["type"] == "request_timeout"

        # a connection that sends nothing at all is closed too (no answer: there was no request)
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.settimeout(30)
            assert sock.recv(100) == b""

        # after a complete request on a kept-alive connection, the next headers get the same deadline
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            head, body = _read_response(sock)
            assert head.startswith(b"HTTP/1.1 200") and body["status"] == "ok", head
            got, closed = _trickle_until_closed(sock, b"GET /health HTTP/1.1\r\n", b"X-A: b\r\n", 30)
        assert closed and got.startswith(b"HTTP/1.1 408"), got

        # a body that stops arriving: 408 with the envelope, then the connection is closed
        with socket.create_connection(("127.0.0.1", port)) as sock:
            head = b"POST /v1/generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            head += b"Content-Length: 500\r\n\r\n"
            sock.sendall(head + b'{"query": "')
            answer, body = _read_response(sock)
            assert answer.startswith(b"HTTP/1.1 408") and b"connection: close" in answer.lower(), answer
            assert body["error"]["type"] == "request_timeout" and "HYPIC_BODY_TIMEOUT_S" in body["error"]["message"]
            assert sock.recv(100) == b""  # closed

        # the server still answers
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            sock.settimeout(30)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")


def test_connections_past_the_cap_get_503_at_once(engine, tmp_path):
    with serving(engine, tmp_path, max_connections=2, header_timeout_s=60) as port:
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
        try:
            time.sleep(0.2)  # both accepted (the server runs on its own thread)
            with socket.create_connection(("127.0.0.1", port)) as extra:
                extra.settimeout(30)
                got = b""
                while data := extra.recv(65536):
                    got += data
            assert got.startswith(b"HTTP/1.1 503"), got
            assert json.loads(got.split(b"\r\n\r\n", 1)[1])["error"]["type"] == "overloaded"
        finally:
            for s in held:
                s.close()
        deadline = time.monotonic() + 30
        while True:  # once the others are gone, connections are served again
            with socket.create_connection(("127.0.0.1", port)) as sock:
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                sock.settimeout(30)
                answer = sock.recv(65536)
            if answer.startswith(b"HTTP/1.1 200") or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert answer.startswith(b"HTTP/1.1 200"), answer
