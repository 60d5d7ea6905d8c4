"""``JobStream``: one submitted job's events, handed by the engine thread straight to the event loop.

The scheduler calls the stream's sink on the engine thread with each event; the sink stamps it and
posts it to the loop's ``LoopInbox``: one thread hop from the engine to the response, as a direct
caller has. (The server used to run a pump thread per request that read a blocking queue and
re-posted to the loop: two hops, each waiting for the GIL behind the busy engine thread.) The inbox
wakes the loop once per batch of pending events, not once per event: a decode step of 64 requests
posts 64 events, and each wake-up (``call_soon_threadsafe``) is a write to the loop's self-pipe
that also hands the GIL to the loop thread in the middle of the engine thread's step. ``submit``
does no model work or I/O, so ``open`` runs on the loop.

The job's registry hints (``cache.described``) are held from ``open`` until the request ends or is
cancelled (with the engine process, by that process: ``ServerState.describe``). ``cancel()`` (client
gone) frees the request's state at the scheduler's next step. With the engine process the sink is
called on the client's reader thread, one batch of events per message from the engine, the same
single hop to the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

from fastapi import Request

from hypic_agent.api import service
from hypic_agent.api.state import ServerState
from hypic_agent.errors import ClientClosedError
from hypic_agent.runtime.results import FinishEvent
from hypic_agent.runtime.scheduler.request import END, RequestHandle

log = logging.getLogger("hypic.api.stream")
DISCONNECT_POLL_S = 0.1  # how often a non-streaming request checks that its client is still there


class LoopInbox:
    """Items posted from other threads (engine threads), delivered on one event loop in the order
    they were posted, each exactly once, with one wake-up of the loop per batch: the first post
    after a drain schedules the next drain (``call_soon_threadsafe``); posts until that drain runs
    only join the batch. ``of(loop)`` is the loop's one inbox."""

    _inboxes: ClassVar[dict[int, LoopInbox]] = {}  # by id of the loop, held until the loop is closed
    _inboxes_lock = threading.Lock()

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._pending: list[tuple[Callable[[Any], None], Any]] = []
        self.wakeups = 0  # drains scheduled (for tests and benchmarks)

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> LoopInbox:
        with cls._inboxes_lock:
            for key in [k for k, v in cls._inboxes.items() if v._loop.is_closed()]:
                del cls._inboxes[key]
            inbox = cls._inboxes.get(id(loop))
            if inbox is None:
                inbox = cls._inboxes[id(loop)] = cls(loop)
            return inbox

    def post(self, deliver: Callable[[Any], None], item: Any) -> bool:
        """Have ``deliver(item)`` called on the loop (any thread). False when the loop is closed:
        nothing will be delivered any more."""
        if self._loop.is_closed():
            return False
        with self._lock:
            self._pending.append((deliver, item))
            if len(self._pending) > 1:  # a drain is scheduled already and has not taken the batch
                return True
            self.wakeups += 1
        try:
            self._loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed: nobody listens any more
            with self._lock:
                self._pending.clear()
            return False
        return True

    def _drain(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
        for deliver, item in batch:
            try:
                deliver(item)
            except Exception:  # one consumer's failure never loses the others' items
                log.exception("delivering an event to its stream failed")


class JobStream:
    def __init__(self, st: ServerState, job: service.GenerateJob) -> None:
        self.job = job
        self._loop = asyncio.get_running_loop()
        self._inbox = LoopInbox.of(self._loop)
        self._queue: asyncio.Queue[tuple[Any, float]] = asyncio.Queue()
        self._hints: contextlib.ExitStack | None = contextlib.ExitStack()
        hints = service.hints_of(job)
        self._hints.enter_context(st.describe(hints))
        try:
            self.handle: RequestHandle = service.submit_job(st, job, self._deliver, hints)  # 4xx / 429 here
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
        if not self._inbox.post(self._queue.put_nowait, (item, time.perf_counter())):
            handle = getattr(self, "handle", None)  # the loop is closed: nobody listens any more
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
