"""``JobStream``: one submitted job's events, handed by the engine thread straight to the event loop.

The scheduler calls the stream's sink on the engine thread with each event; the sink stamps it and
schedules it onto the loop (``call_soon_threadsafe``): one thread hop from the engine to the
response, as a direct caller has. (The server used to run a pump thread per request that read a
blocking queue and re-posted to the loop: two hops, each waiting for the GIL behind the busy engine
thread.) ``submit`` does no model work or I/O, so ``open`` runs on the loop.

The job's registry hints (``cache.described``) are held from ``open`` until the request ends or is
cancelled. ``cancel()`` (client gone) frees the request's state at the scheduler's next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from fastapi import Request

from hypic_agent.api import service
from hypic_agent.api.state import ServerState
from hypic_agent.errors import ClientClosedError
from hypic_agent.runtime.results import FinishEvent
from hypic_agent.runtime.scheduler.request import END, RequestHandle

DISCONNECT_POLL_S = 0.1  # how often a non-streaming request checks that its client is still there


class JobStream:
    def __init__(self, st: ServerState, job: service.GenerateJob) -> None:
        self.job = job
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[tuple[Any, float]] = asyncio.Queue()
        self._hints: contextlib.ExitStack | None = contextlib.ExitStack()
        self._hints.enter_context(st.cache.described(service.hints_of(job)))
        try:
            self.handle: RequestHandle = service.submit_job(st, job, self._deliver)  # 4xx / 429 here
        except BaseException:
            self._release()
            raise
        self._ended = False

    @classmethod
    def open(cls, st: ServerState, job: service.GenerateJob) -> JobStream:
        """Submit ``job`` (raises the scheduler's 4xx / ``QueueFullError`` before anything runs)."""
        return cls(st, job)

    # -- engine thread
    def _deliver(self, item: Any) -> None:
        stamp = time.perf_counter()
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, (item, stamp))
        except RuntimeError:  # the loop is closed: nobody listens any more
            handle = getattr(self, "handle", None)
            if handle is not None:
                handle.cancel()

    # -- event loop
    async def next(self) -> service.Timed | None:
        """The next event with its clock; ``None`` after the last; re-raises the error that ended it."""
        if self._ended:
            return None
        item, stamp = await self._queue.get()
        if item is END:
            self._ended = True
            self._release()
            return None
        if isinstance(item, BaseException):
            self._ended = True
            self._release()
            raise item
        return service.Timed(item, (stamp - self.job.t0) * 1e3, self.handle.queue_ms)

    async def first(self) -> service.Timed:
        """The first event (errors before it still get a proper status); cancels the request if the
        wait is cancelled or fails."""
        try:
            t = await self.next()
        except BaseException:
            self.cancel()
            raise
        if t is None:
            raise ClientClosedError("the request was cancelled before its first event")
        return t

    def cancel(self) -> None:
        """Stop the request (client gone or done reading); idempotent."""
        self.handle.cancel()
        self._release()

    @property
    def cancelled(self) -> bool:
        return self.handle.cancelled

    def _release(self) -> None:
        if self._hints is not None:
            self._hints.close()
            self._hints = None


async def finish_job(st: ServerState, job: service.GenerateJob, request: Request) -> tuple[service.Timed, float]:
    """Run ``job`` to its end for a non-streaming route: (the finish event with its clock, ms to the
    first event). The connection is watched: a client that disconnects has its request cancelled
    (the scheduler frees its state at the next step) instead of decoding on to ``max_tokens`` for
    nobody, and gets ``ClientClosedError``."""
    stream = JobStream.open(st, job)

    async def watch() -> None:
        while not await request.is_disconnected():
            await asyncio.sleep(DISCONNECT_POLL_S)
        stream.cancel()

    watcher = asyncio.ensure_future(watch())
    ttft: float | None = None
    try:
        while (t := await stream.next()) is not None:
            ttft = t.since_start_ms if ttft is None else ttft
            if isinstance(t.event, FinishEvent):
                return t, ttft
        raise ClientClosedError("the request was cancelled before it finished")
    finally:
        watcher.cancel()
        stream.cancel()
