"""The serving core through HTTP: concurrent streams are batched and each gets the answer it gets
alone; a short request is not held behind a long one; a full queue answers 429 with Retry-After,
a request that can never fit the state pool 400; a non-streaming client that disconnects has its
request cancelled; ``/metrics`` reports the pool."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient

from hypic_agent.api import create_app
from hypic_agent.config import Settings
from hypic_agent.runtime.engine import Engine
from hypic_agent.runtime.results import FinishEvent
from hypic_agent.runtime.sampling import SamplingParams
from hypic_agent.runtime.scheduler.request import END, GenerationRequest
from tests.api.conftest import BERLIN, PARIS, ROME, TINY, doc, state

DOCS = [doc(PARIS, "Paris"), doc(BERLIN, "Berlin"), doc(ROME, "Rome")]


def _stream_text(client: TestClient, body: dict) -> str:
    text = []
    with client.stream("POST", "/v1/generate", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                text.append(json.loads(line[6:]).get("text", ""))
    return "".join(text)


def test_eight_concurrent_streams_each_get_their_own_answer(client):
    bodies = [
        {"segments": [DOCS[i % 3], DOCS[(i + 1) % 3]], "query": f"Question {i}: which city?", "max_tokens": 12}
        for i in range(8)
    ]
    alone = [client.post("/v1/generate", json=b).json()["text"] for b in bodies]
    forwards = state(client).serving.scheduler.stats.forwards
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda b: _stream_text(client, b), bodies))
    assert together == alone
    sched = state(client).serving.scheduler
    tokens = sum(len(t) for t in alone)  # byte-level tiny tokenizer: about a token per character
    assert sched.stats.forwards - forwards < tokens  # decode steps were shared between streams
    assert sched.snapshot()["slots_used"] == 0


def test_short_request_is_not_held_behind_a_long_one(client, monkeypatch):
    serving = state(client).serving
    monkeypatch.setattr(Engine, "eos_ids", property(lambda self: ()))  # the long one runs to max_tokens
    seg = type("Seg", (), {"token_ids": tuple(range(40, 90)), "kind": "document"})()
    plan = type("Plan", (), {"segments": [seg], "suffix_ids": [5, 6, 7], "bos_id": None})()
    long_events: list = []  # the long request's events as the engine thread hands them over
    started, ended = threading.Event(), threading.Event()

    def sink(item) -> None:
        long_events.append(item)
        started.set()
        if item is END:
            ended.set()

    serving.scheduler.submit(GenerationRequest(plan, SamplingParams(max_tokens=600)), sink)
    assert started.wait(120)  # decoding has started
    r = client.post("/v1/generate", json={"segments": [DOCS[0]], "query": "Capital?", "max_tokens": 3})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    seen = list(long_events)  # what the long one had produced when the short one was answered
    assert not any(isinstance(e, FinishEvent) for e in seen) and len(seen) < 600, len(seen)
    assert ended.wait(120)
    assert isinstance(long_events[-2], FinishEvent) and long_events[-2].completion_tokens == 600


@pytest.fixture
def small_engine(tmp_path):
    from hypic_agent.runtime.loader import load_engine

    settings = Settings(home=tmp_path / "e", device="cpu", max_waiting=1, max_running=1, kv_pool_tokens=256)
    engine = load_engine(settings, model=TINY)
    yield engine
    engine.close()


def test_full_queue_is_429_and_a_request_that_never_fits_is_400(small_engine, tmp_path):
    settings = Settings(home=tmp_path / "app", device="cpu", model=TINY)
    with TestClient(create_app(settings, engine=small_engine), raise_server_exceptions=False) as client:
        big = client.post("/v1/generate", json={"segments": [doc(PARIS * 3)], "query": "q", "max_tokens": 100})
        assert big.status_code == 400 and "can never fit the state pool" in big.json()["error"]["message"]
        seg = type("Seg", (), {"token_ids": (1, 2, 3), "kind": "document"})()
        plan = type("Plan", (), {"segments": [seg], "suffix_ids": [4], "bos_id": None})()
        with small_engine.lock:  # the engine thread cannot step: the one queued request stays queued
            state(client).serving.scheduler.submit(GenerationRequest(plan, SamplingParams(max_tokens=2)))
            r = client.post("/v1/generate", json={"segments": [doc(PARIS)], "query": "q", "max_tokens": 2})
        assert r.status_code == 429 and r.json()["error"]["type"] == "queue_full"
        assert int(r.headers["retry-after"]) >= 1
        text = client.get("/metrics").text
        assert "hypic_pool_pages_total 4.0" in text and 'hypic_scheduler_requests{state="waiting"}' in text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_disconnected_non_streaming_client_stops_the_decode(engine, tmp_path, monkeypatch):
    monkeypatch.setattr(Engine, "eos_ids", property(lambda self: ()))
    app = create_app(Settings(home=tmp_path / "srv", device="cpu", model=TINY), engine=engine)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    try:
        for _ in range(200):
            if server.started:
                break
            time.sleep(0.05)
        sched = app.state.hypic.serving.scheduler
        before = sched.stats.cancelled
        body = {"segments": [doc(PARIS)], "query": "q", "max_tokens": 3000}
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"http://127.0.0.1:{port}/v1/generate", json=body, timeout=1.5)
        deadline = time.time() + 10
        while sched.stats.cancelled == before and time.time() < deadline:
            time.sleep(0.05)
        assert sched.stats.cancelled == before + 1
        assert sched.snapshot()["slots_used"] == 0
    finally:
        server.should_exit = True
        th.join(10)


def test_switch_interval_setting_holds_while_serving(engine, tmp_path):
    before = sys.getswitchinterval()
    settings = Settings(home=tmp_path / "srv", device="cpu", model=TINY, switch_interval_ms=0.5)
    with TestClient(create_app(settings, engine=engine)) as client:
        assert client.get("/v1/models").status_code == 200
        assert sys.getswitchinterval() == pytest.approx(0.0005)  # the event loop gets the GIL sooner
    assert sys.getswitchinterval() == pytest.approx(before)  # restored at shutdown
