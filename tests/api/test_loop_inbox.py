"""``LoopInbox``: events posted from engine threads reach their streams on the event loop in order, each
exactly once, with one wake-up of the loop per batch; a closed loop refuses posts (the stream then
cancels its request); one consumer's failure loses no other item."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from hypic_agent.api.job_stream import LoopInbox


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    lp = asyncio.new_event_loop()
    t = threading.Thread(target=lp.run_forever, daemon=True)
    t.start()
    yield lp
    if not lp.is_closed():
        lp.call_soon_threadsafe(lp.stop)
        t.join(10)
        lp.close()


def _on_loop(loop: asyncio.AbstractEventLoop, fn: Any) -> Any:
    async def call() -> Any:
        return fn()

    return asyncio.run_coroutine_threadsafe(call(), loop).result(10)


def test_a_batch_posted_while_the_loop_is_busy_wakes_it_once(loop):
    inbox = LoopInbox.of(loop)
    assert LoopInbox.of(loop) is inbox
    busy, release = threading.Event(), threading.Event()
    loop.call_soon_threadsafe(lambda: (busy.set(), release.wait(10)))  # the loop is held inside a callback
    assert busy.wait(10)
    got: dict[int, list[int]] = {i: [] for i in range(64)}
    for step in range(3):  # three decode steps of 64 streams
        for i in range(64):
            assert inbox.post(got[i].append, step)
    assert inbox.wakeups == 1  # the first post scheduled the drain; the rest joined its batch
    release.set()
    _on_loop(loop, lambda: None)  # the drain ran before this
    assert got == {i: [0, 1, 2] for i in range(64)}
    assert inbox.post(got[0].append, 3)  # a post after the drain schedules the next one
    _on_loop(loop, lambda: None)
    assert inbox.wakeups == 2 and got[0] == [0, 1, 2, 3]


def test_concurrent_producers_deliver_every_item_once_in_order(loop):
    inbox = LoopInbox.of(loop)
    n_streams, per_stream = 32, 300
    got: dict[tuple[int, int], list[int]] = {(p, s): [] for p in range(3) for s in range(n_streams)}

    def produce(p: int) -> None:
        for k in range(per_stream):
            for s in range(n_streams):
                assert inbox.post(got[(p, s)].append, k)

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    _on_loop(loop, lambda: None)
    _on_loop(loop, lambda: None)
    assert all(items == list(range(per_stream)) for items in got.values())
    assert 1 <= inbox.wakeups <= 3 * per_stream * n_streams


def test_a_failing_consumer_loses_no_other_item(loop):
    inbox = LoopInbox.of(loop)
    got: list[int] = []

    def boom(_: Any) -> None:
        raise RuntimeError("consumer failed")

    busy, release = threading.Event(), threading.Event()
    loop.call_soon_threadsafe(lambda: (busy.set(), release.wait(10)))
    assert busy.wait(10)
    inbox.post(got.append, 1)
    inbox.post(boom, None)
    inbox.post(got.append, 2)
    release.set()
    _on_loop(loop, lambda: None)
    assert got == [1, 2]


def test_a_closed_loop_refuses_posts_and_its_inbox_is_dropped():
    lp = asyncio.new_event_loop()
    inbox = LoopInbox.of(lp)
    assert inbox.post(print, "never run")  # scheduled, the loop never runs it
    lp.close()
    assert not inbox.post(print, "refused")
    assert not inbox.post(print, "refused again")  # not silently joined to the batch that never ran
    other = asyncio.new_event_loop()
    try:
        LoopInbox.of(other)
        assert id(lp) not in LoopInbox._inboxes
    finally:
        other.close()


# ------------------------------------------------------------------ through JobStream, on the served engine
def _job(client: Any, max_tokens: int) -> Any:
    import dataclasses

    from hypic_agent.api import service
    from hypic_agent.api.schemas import GenerateRequest
    from tests.api.conftest import PARIS, doc, state

    st = state(client)
    req = GenerateRequest.model_validate({"segments": [doc(PARIS)], "query": "q", "max_tokens": max_tokens})
    job = service.prepare_job(st, req, [s.to_segment() for s in req.segments], req.query, "default")
    job.sampling = dataclasses.replace(job.sampling, ignore_eos=True)
    return st, job


def test_concurrent_job_streams_get_every_token_once_in_order_with_their_clocks(client):
    from hypic_agent.api.job_stream import JobStream
    from hypic_agent.runtime.results import FinishEvent

    st, job = _job(client, 24)

    async def one() -> tuple[list[int], FinishEvent, list[float]]:
        stream = JobStream.open(st, job)
        ids, clocks = [], []
        while (t := await stream.next()) is not None:
            clocks.append(t.since_start_ms)
            if isinstance(t.event, FinishEvent):
                return ids, t.event, clocks
            if t.event.token_id is not None:
                ids.append(t.event.token_id)
        raise AssertionError("no finish event")

    async def many() -> list[Any]:
        return await asyncio.gather(*(one() for _ in range(6)))

    for ids, fin, clocks in asyncio.run(many()):
        assert ids == fin.token_ids and len(ids) == 24
        assert clocks == sorted(clocks)  # stamped on the engine thread as each event was posted


def test_a_stream_whose_loop_closed_cancels_its_request(client):
    from hypic_agent.api.job_stream import JobStream

    st, job = _job(client, 400)
    streams: list[JobStream] = []

    async def start() -> None:
        stream = JobStream.open(st, job)
        await stream.first()
        streams.append(stream)

    asyncio.run(start())  # the loop is closed when run returns: nobody reads the rest
    handle = streams[0].handle
    for _ in range(200):
        if handle.cancelled:
            break
        threading.Event().wait(0.05)
    assert handle.cancelled  # the next event found the loop closed
    assert st.engine.lock.acquire(timeout=5)
    st.engine.lock.release()
