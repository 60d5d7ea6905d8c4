"""N clients at once: shared cold segments are prefilled once, every request succeeds;
a cancelled stream releases the engine and leaves the store consistent."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from concurrent.futures import ThreadPoolExecutor

from hypic_agent.api import service
from hypic_agent.api.job_stream import JobStream
from hypic_agent.api.schemas import GenerateRequest
from tests.api.conftest import BERLIN, PARIS, doc, state, store_snapshot

N = 6


def test_shared_cold_segments_prefilled_once(client):
    shared = [doc(PARIS, "Paris"), doc(BERLIN, "Berlin")]
    barrier = threading.Barrier(N)

    def one(i: int):
        own = doc(f"Private note {i}: client {i} likes the number {i * 11} and the colour blue.")
        barrier.wait()
        body = {"segments": [*shared, own] if i % 2 else [own, *shared[::-1]], "query": f"q{i}", "max_tokens": 2}
        if i % 3 == 0:
            body["stream"] = True
        return client.post("/v1/generate", json=body)

    with ThreadPoolExecutor(N) as pool:
        responses = list(pool.map(one, range(N)))
    assert [r.status_code for r in responses] == [200] * N
    cache = state(client).cache
    assert set(cache.inserts.values()) == {1}  # one prefill per cold segment
    assert len(cache.inserts) == 2 + N
    text = client.get("/metrics").text
    assert f"hypic_cold_segments_total {2 + N}.0" in text
    assert "hypic_queue_depth 0.0" in text
    listed = client.get("/v1/segments", params={"limit": 100}).json()["data"]
    assert len(listed) == 2 + N and all(d["tier"] == "cpu" for d in listed)


def test_cancelled_stream_releases_engine_and_store_stays_consistent(client):
    st = state(client)
    req = GenerateRequest.model_validate({"segments": [doc(PARIS)], "query": "q", "max_tokens": 400})
    job = service.prepare_job(st, req, [s.to_segment() for s in req.segments], req.query, "default")
    job.sampling = dataclasses.replace(job.sampling, ignore_eos=True)  # would run all 400 tokens

    async def run() -> int:
        stream = JobStream.open(st, job)
        await stream.first()
        stream.cancel()  # the client went away after the first token
        n = 0
        while await stream.next() is not None:
            n += 1
        return n

    after_cancel = asyncio.run(run())
    assert after_cancel < 100  # stopped early, not after 400 tokens
    assert st.cache.pending_hints() == 0  # the request's registry hints were let go
    got = st.engine.lock.acquire(timeout=5)
    assert got
    st.engine.lock.release()
    snap = store_snapshot(client)
    assert snap["entries"] == 1 and all(row[-1] == "ready" for row in snap["rows"])
    r = client.post("/v1/generate", json={"segments": [doc(PARIS)], "query": "q", "max_tokens": 1})
    assert r.status_code == 200 and r.json()["usage"]["segments"][0]["hit"] is True
