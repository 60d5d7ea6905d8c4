"""The engine core in its own process (``HYPIC_ENGINE_PROCESS``, ``runtime/core_process``).

Through an app whose engine, scheduler and segment store live in a spawned engine process: the same
greedy tokens as the in-process app (generate, SSE, chat); a segment PUT and a request that uses its
id across the pipe; 8 concurrent streams batched in the engine (a short one is not held behind a
long one started earlier), their events arriving several per pipe message; a SIGKILL of the engine
process mid-request fails the streaming and the non-streaming request with 503 ``engine_dead`` (an
SSE error event for the stream), ``/health`` says so and new requests get 503 at once, and the
entries stored before the kill are still on disk; a clean shutdown stops the engine process and
loses no entry; the API process killed leaves no engine process behind.

Every app here spawns an engine process (~7 s on 2 CPU cores to import torch and load the tiny
model), so the tests share one where they can.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from hypic_agent.api import create_app
from hypic_agent.config import Settings
from hypic_agent.segments.store.segment_store import SegmentStore
from tests.api.conftest import BERLIN, PARIS, ROME, TINY, doc, err, sse_events, state

pytestmark = pytest.mark.timeout(180)  # a hang fails the test instead of the run
ROOT = Path(__file__).resolve().parents[2]
DOCS = [doc(PARIS, "Paris"), doc(BERLIN, "Berlin"), doc(ROME, "Rome")]
LONG = {"segments": [DOCS[0]], "query": "Tell me everything about it.", "max_tokens": 300}


def _settings(home: Path, **kw: Any) -> Settings:
    return Settings(home=home, device="cpu", model=TINY, engine_process=True, **kw)


def _gone(pid: int) -> bool:
    """The process has exited (reaped, or a zombie no one reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _gone(pid):
            return True
        time.sleep(0.05)
    return _gone(pid)


class App:
    """A ``TestClient`` over an app with an engine process; ``close`` is the server's shutdown."""

    def __init__(self, home: Path, **kw: Any) -> None:
        self.settings = _settings(home, **kw)
        self.client = TestClient(create_app(self.settings), raise_server_exceptions=False)
        self.client.__enter__()
        self.st = state(self.client)
        self.core = self.st.core
        self.closed = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.client.__exit__(None, None, None)


@pytest.fixture(scope="module")
def proc_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    app = App(tmp_path_factory.mktemp("engine-process"))
    yield app
    app.close()


def _stream(client: TestClient, body: dict[str, Any], url: str = "/v1/generate") -> list[Any]:
    with client.stream("POST", url, json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        return sse_events(r.read().decode())


def _ids(events: list[Any]) -> list[int]:
    return [e["token_id"] for e in events if isinstance(e, dict) and e.get("token_id") is not None]


# ----------------------------------------------------------------------------- same answers


def test_the_app_serves_from_another_process(proc_app: App) -> None:
    st = proc_app.st
    assert st.core is not None and st.serving is None and st.cache is None  # nothing of the engine here
    assert st.core.pid != os.getpid() and not _gone(st.core.pid)
    assert st.engine.name == TINY and st.engine.max_context > 0
    r = proc_app.client.get("/health")
    assert r.status_code == 200 and r.json()["status"] == "ok" and r.json()["model"] == TINY


def test_same_greedy_tokens_as_in_process(proc_app: App, client: TestClient) -> None:
    """generate (JSON and SSE) and chat (JSON and SSE) give the in-process app's tokens, byte for byte."""
    body = {"segments": [DOCS[1], DOCS[2]], "query": "Which river?", "max_tokens": 12, "logprobs": True}
    local = client.post("/v1/generate", json=body).json()
    remote = proc_app.client.post("/v1/generate", json=body).json()
    assert remote["text"] == local["text"] and remote["finish_reason"] == local["finish_reason"]
    assert [x["token_id"] for x in remote["logprobs"]] == [x["token_id"] for x in local["logprobs"]]
    assert remote["usage"]["completion_tokens"] == local["usage"]["completion_tokens"] > 0
    assert remote["usage"]["prompt_tokens"] == local["usage"]["prompt_tokens"]
    local_ids, remote_ids = _ids(_stream(client, body)), _ids(_stream(proc_app.client, body))
    assert remote_ids == local_ids == [x["token_id"] for x in local["logprobs"]]
    last = _stream(proc_app.client, body)[-2]  # the finish event, then [DONE]
    assert last["finish_reason"] == local["finish_reason"] and last["usage"]["cached_tokens"] > 0  # cached by now
    rows = {d["title"]: d for d in proc_app.client.get("/v1/segments").json()["data"]}
    assert rows.keys() == {"Berlin", "Rome"}  # the request's registry hints reached the engine's store

    chat = {"messages": [{"role": "system", "content": PARIS}, {"role": "user", "content": "Capital?"}]}
    chat["max_tokens"] = 10
    lc = client.post("/v1/chat/completions", json=chat).json()
    rc = proc_app.client.post("/v1/chat/completions", json=chat).json()
    assert rc["choices"][0]["message"] == lc["choices"][0]["message"]
    assert rc["usage"]["completion_tokens"] == lc["usage"]["completion_tokens"] > 0
    deltas = [
        c["choices"][0]["delta"].get("content") or ""
        for c in _stream(proc_app.client, chat, "/v1/chat/completions")
        if isinstance(c, dict) and c.get("choices")
    ]
    assert "".join(deltas) == (lc["choices"][0]["message"]["content"] or "")


def test_text_made_on_either_side_of_the_pipe(proc_app: App, client: TestClient) -> None:
    """Without stop strings the engine process sends ids and the API process makes the text
    (``core_process.detok``); with them the engine keeps the text to stop on it. Both give the in-process
    app's text, streamed pieces and whole."""
    base = {"segments": [DOCS[0]], "query": "Why?", "max_tokens": 40}  # greedy, the tiny model answers this in text
    local = client.post("/v1/generate", json=base).json()["text"]
    assert len(local) > 8
    stop = local[len(local) // 2 : len(local) // 2 + 3]
    for body in (base, {**base, "stop": [stop]}):
        want = client.post("/v1/generate", json=body).json()
        got = proc_app.client.post("/v1/generate", json=body).json()
        assert got["text"] == want["text"] and got["finish_reason"] == want["finish_reason"]
        pieces = [e["text"] for e in _stream(proc_app.client, body) if isinstance(e, dict) and "token_id" in e]
        assert "".join(pieces) == want["text"]
    assert stop not in want["text"] and len(want["text"]) < len(local)  # the stop string cut it there


def test_structured_output_crosses_the_process(proc_app: App, client: TestClient) -> None:
    """A response_format grammar is compiled again in the engine process and constrains it the same way."""
    chat = {
        "messages": [{"role": "user", "content": "Give me a JSON object."}],
        "max_tokens": 24,
        "response_format": {"type": "json_object"},
    }
    lc = client.post("/v1/chat/completions", json=chat).json()
    rc = proc_app.client.post("/v1/chat/completions", json=chat).json()
    assert rc["choices"][0]["message"]["content"] == lc["choices"][0]["message"]["content"]
    assert rc["choices"][0]["message"]["content"].startswith("{")


def test_segment_put_then_its_id_in_a_request(proc_app: App) -> None:
    c = proc_app.client
    rome = doc(ROME + " Its river is the Tiber.", "Rome", cache={"pin": True}, metadata={"src": "x"})
    put = c.put("/v1/segments", json={"segments": [rome]})
    assert put.status_code == 200, put.text
    [seg] = put.json()["data"]
    assert seg["pin"] is True and seg["tier"] is not None and seg["tokens"] > 16
    got = c.get(f"/v1/segments/{seg['id']}").json()
    assert got["title"] == "Rome" and "Rome is the capital" in got["text"] and got["metadata"] == {"src": "x"}
    r = c.post("/v1/generate", json={"segments": [{"id": seg["id"]}], "query": "River?", "max_tokens": 3})
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert usage["segments"][0]["id"] == seg["id"] and usage["segments"][0]["hit"] is True
    assert usage["cached_tokens"] == seg["tokens"] - 8  # all but the 8-token seam, from the PUT's entry
    assert seg["id"] in [d["id"] for d in c.get("/v1/segments").json()["data"]]
    missing = c.get("/v1/segments/" + "0" * 32)
    assert missing.status_code == 404 and err(missing)["type"] == "segment_not_found"  # raised over the pipe
    assert c.delete(f"/v1/segments/{seg['id']}").json()["deleted"] is True
    assert c.get(f"/v1/segments/{seg['id']}").status_code == 404
    metrics = c.get("/metrics").text
    assert "hypic_pool_slots_total" in metrics and "hypic_store_entries" in metrics


# ----------------------------------------------------------------------------- batching


def test_eight_streams_batch_and_a_short_one_is_not_held_behind_a_long_one(proc_app: App) -> None:
    c, core = proc_app.client, proc_app.core
    shorts = [{"segments": [DOCS[i % 3]], "query": f"Question {i}: which city?", "max_tokens": 4} for i in range(7)]
    alone = [c.post("/v1/generate", json=b).json()["text"] for b in shorts]
    forwards0 = core.snapshot().counters["forwards"]
    messages0, events0 = core.messages_received, core.events_received
    done: dict[str, float] = {}
    long_tokens: list[int] = []
    first = threading.Event()

    def long_stream() -> dict[str, Any]:
        with c.stream("POST", "/v1/generate", json={**LONG, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    ev = json.loads(line[6:])
                    if ev.get("token_id") is not None:
                        long_tokens.append(ev["token_id"])
                        first.set()
                    if ev.get("finish_reason"):
                        done["long"] = time.monotonic()
                        return ev
        raise AssertionError("the long stream ended without its finish event")

    def short(i: int) -> str:
        text = "".join(e.get("text", "") for e in _stream(c, shorts[i]) if isinstance(e, dict))
        done[f"short{i}"] = time.monotonic()
        done[f"long_at{i}"] = len(long_tokens)
        return text

    with ThreadPoolExecutor(8) as pool:
        long_fut = pool.submit(long_stream)
        assert first.wait(60)  # the long request decodes
        together = list(pool.map(short, range(7)))
        fin = long_fut.result(timeout=120)
    assert together == alone  # each stream got the answer it gets alone
    assert fin["usage"]["completion_tokens"] == LONG["max_tokens"]  # it ran to its end, after the short ones
    for i in range(7):
        assert done[f"short{i}"] < done["long"], f"short {i} finished after the long one"
        assert done[f"long_at{i}"] < LONG["max_tokens"]
    messages, events = core.messages_received - messages0, core.events_received - events0
    forwards = core.snapshot().counters["forwards"] - forwards0
    assert forwards < LONG["max_tokens"] + 4 * len(shorts)  # decode steps were shared between the streams
    # about one pipe message per engine step (its events batched), not one per event
    assert messages < events and messages <= forwards + 16, (messages, events, forwards)


# ----------------------------------------------------------------------------- shutdown


def test_shutdown_stops_the_engine_process_and_keeps_every_entry(proc_app: App) -> None:
    """Runs last on the shared app: its lifespan's end (a server's SIGTERM) stops the engine process
    cleanly (exit code 0, reaped) and the store it closed still holds every entry."""
    entries = proc_app.st.store.stats().entries
    assert entries >= 3
    pid, proc = proc_app.core.pid, proc_app.core.proc
    t0 = time.monotonic()
    proc_app.close()
    assert time.monotonic() - t0 < 30
    assert proc.exitcode == 0 and _gone(pid)
    store = SegmentStore.from_settings(proc_app.settings)
    try:
        assert store.stats().entries == entries
    finally:
        store.close()


# ----------------------------------------------------------------------------- a crash


def test_killed_engine_fails_requests_with_503_and_health_says_so(tmp_path: Path) -> None:
    app = App(tmp_path / "home")
    c, core = app.client, app.core
    try:
        warm = c.post("/v1/generate", json={"segments": [DOCS[1]], "query": "Which river?", "max_tokens": 2})
        assert warm.status_code == 200
        out: dict[str, Any] = {}
        body = {"segments": [DOCS[0]], "query": "Tell me everything about it.", "max_tokens": 3000}

        def streaming() -> None:
            with c.stream("POST", "/v1/generate", json={**body, "stream": True}) as r:
                out["stream_status"] = r.status_code
                out["stream"] = sse_events(r.read().decode())

        def blocking() -> None:
            r = c.post("/v1/generate", json={**body, "query": "And now in detail?"})
            out["status"], out["body"] = r.status_code, r.json()

        threads = [threading.Thread(target=f) for f in (blocking, streaming)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while core.snapshot().requests["running"] < 2:  # both decode in the engine process
            assert time.monotonic() < deadline and "status" not in out and "stream" not in out, out
            time.sleep(0.05)
        entries = app.st.store.stats().entries  # DOCS[1] and DOCS[0], stored before their decoding began
        os.kill(core.pid, signal.SIGKILL)
        for t in threads:
            t.join(30)
            assert not t.is_alive(), "a request hangs after the engine process died"

        assert out["status"] == 503 and set(out["body"]) == {"error"}
        e = out["body"]["error"]
        assert e["type"] == "engine_dead"
        assert f"engine process (pid {core.pid})" in e["message"] and "SIGKILL" in e["message"]
        assert out["stream_status"] == 200 and out["stream"][-1] == "[DONE]"  # the 200 went out before the kill
        tail = out["stream"][-2]
        assert tail["error"]["type"] == "engine_dead" and f"pid {core.pid}" in tail["error"]["message"]
        assert any(isinstance(ev, dict) and ev.get("token_id") is not None for ev in out["stream"])

        health = c.get("/health")
        assert health.status_code == 503
        h = health.json()
        assert h["status"] == "engine_dead" and h["engine"] == {"pid": core.pid, "exitcode": -9}
        assert h["error"]["type"] == "engine_dead" and "killed by signal 9 (SIGKILL)" in h["error"]["message"]

        t0 = time.monotonic()
        later = c.post("/v1/generate", json={"segments": [DOCS[2]], "query": "q", "max_tokens": 2})
        assert later.status_code == 503 and err(later)["type"] == "engine_dead"
        put = c.put("/v1/segments", json={"segments": [doc(ROME)]})
        assert put.status_code == 503 and err(put)["type"] == "engine_dead"
        assert time.monotonic() - t0 < 5  # refused at once, not after a timeout
        assert c.get("/v1/models").status_code == 200  # the API itself still answers
        assert c.get("/metrics").status_code == 200
    finally:
        t0 = time.monotonic()
        app.close()
        assert time.monotonic() - t0 < 10
    store = SegmentStore.from_settings(app.settings)  # what was stored before the kill is all there
    try:
        assert store.stats().entries == entries == 2
    finally:
        store.close()


def test_killed_api_process_takes_the_engine_process_with_it(tmp_path: Path) -> None:
    """No orphan holding the device: the API process SIGKILLed, its engine process sees the pipe close
    and exits by itself."""
    code = (
        "import sys, time\n"
        "from hypic_agent.config import Settings\n"
        "from hypic_agent.runtime.core_process import EngineClient\n"
        "if __name__ == '__main__':\n"
        f"    c = EngineClient.start(Settings(home={str(tmp_path)!r}, device='cpu', model={TINY!r}))\n"
        "    print(c.pid, flush=True)\n"
        "    time.sleep(120)\n"
    )
    script = tmp_path / "api.py"
    script.write_text(code)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    api = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        assert api.stdout is not None
        line = api.stdout.readline()
        assert line.strip().isdigit(), line
        engine_pid = int(line)
        assert not _gone(engine_pid)
        api.kill()
        api.wait(10)
        assert _wait_gone(engine_pid, 20), "the engine process outlived the API process"
    finally:
        if api.poll() is None:
            api.kill()
