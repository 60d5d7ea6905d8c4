"""``EngineClient``: the API process's side of the engine process (``core``).

``EngineClient.start`` spawns the engine process (``multiprocessing``, spawn: a clean interpreter,
CUDA initialised there only), forwards its start-up stages to the caller's ``progress`` (the
``serve`` log) and returns once it answered ``Ready`` (or raises what ended its start-up). Then:

* ``submit(req, sink, hints)`` has ``Scheduler.submit``'s contract: it checks what can be checked
  here (sampling, mode, seam, the context window, the pool's per-request capacity: the same 4xx
  errors, raised at once), returns a ``RemoteHandle`` and queues the request on the ``Outbox`` (no
  pickling or socket write on the caller's thread, an event loop's). Refusals only the engine can
  make (a full queue: 429) arrive as the request's first item, which ``JobStream.first`` raises
  before any response went out, so they keep their status;
* a reader thread receives the engine's messages and hands each event to its request's handle (its
  sink: ``api.job_stream``'s ``LoopInbox``, one wake-up of the event loop per batch), each reply to
  its waiting ``call``; a request without stop strings is sent with ``SamplingParams.detokenize`` off
  and its handle makes the text here from the ids (``detok``), so the engine's loop spends nothing on it;
* ``call(method, ...)``: one engine or store call (``core.CALLS``), blocking (worker threads only);
  ``notify`` sends one without waiting (the store's ``flush`` after each request).

The engine process dying (killed, out of memory, a crash in a kernel) is seen by the reader thread
at once: its end of the pipe closes (and its sentinel fires). Every request in flight then fails
with ``EngineDeadError`` (503 ``engine_dead``, or an SSE error event in a stream that already
started), as does every waiting call, every later submit and call, and ``/health``; the log says
which process died and how (``status``). Nothing waits for an answer that will not come.

``close`` (the app's lifespan end, SIGTERM / Ctrl-C of ``serve``) sends ``Shutdown`` and waits for
the process to stop the scheduler and close the store, then terminates it if it does not; an exit
hook does the same for a client never closed, so no engine process outlives the API process. The
engine process watches its side too (``core``): the API process dying closes the pipe.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import multiprocessing as mp
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection, wait
from typing import Any

from hypic_agent.config import Settings
from hypic_agent.errors import ContextLengthError, EngineDeadError, ServiceUnavailableError
from hypic_agent.runtime.core_process import core
from hypic_agent.runtime.core_process.detok import Detokenizer
from hypic_agent.runtime.core_process.facts import EngineFacts
from hypic_agent.runtime.core_process.handle import RemoteHandle
from hypic_agent.runtime.core_process.outbox import Outbox
from hypic_agent.runtime.core_process.protocol import (
    ADMITTED,
    END,
    ERROR,
    EVENT,
    Call,
    Cancel,
    Progress,
    Ready,
    Reply,
    Shutdown,
    StartFailed,
    Submit,
    WirePlan,
    rid_of,
)
from hypic_agent.runtime.core_process.snapshot import ServingSnapshot
from hypic_agent.runtime.hypic.modes import mode_spec, validate_seam
from hypic_agent.runtime.prompt_pieces import PlanLike, PromptPieces, make_pieces
from hypic_agent.runtime.scheduler.request import EventSink, GenerationRequest

log = logging.getLogger("hypic.core")

CALL_TIMEOUT_S = 120.0  # a store call the engine process does not answer in this long is a 503
SHUTDOWN_TIMEOUT_S = 30.0  # Shutdown -> exit (stops the engine thread, closes the store); then SIGTERM
Progress_ = Callable[..., Any]


def exit_description(exitcode: int | None) -> str:
    """``-9`` -> ``"was killed by signal 9 (SIGKILL)"``, ``1`` -> ``"exited with code 1"``."""
    if exitcode is None:
        return "stopped answering"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = "unknown signal"
        return f"was killed by signal {-exitcode} ({name})"
    return f"exited with code {exitcode}"


@dataclass(frozen=True)
class EngineStatus:
    pid: int
    alive: bool
    exitcode: int | None
    message: str | None  # why it is not serving, None while it is


class _Pending:
    """A call waiting for its reply."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.ok = False
        self.value: Any = None

    def set(self, ok: bool, value: Any) -> None:
        self.ok, self.value = ok, value
        self.done.set()


class EngineClient:
    def __init__(self, settings: Settings, proc: Any, conn: Connection, progress: Progress_ | None) -> None:
        self.settings = settings
        self.proc = proc
        self.pid: int = proc.pid
        self._conn = conn
        self._progress = progress
        self._lock = threading.Lock()
        self._rids = itertools.count(1)
        self._cids = itertools.count(1)
        self._handles: dict[int, RemoteHandle] = {}
        self._calls: dict[int, _Pending] = {}
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self._dead: str | None = None  # why nothing can be served any more (logged once)
        self._closing = False
        self.facts: EngineFacts | None = None
        self.tokenizer: Any = None
        self.events_received = 0  # event items received (for tests and benchmarks)
        self.messages_received = 0  # pipe messages they came in
        self._out = Outbox(conn, "hypic-api-send", on_unsendable=self._unsendable)
        self._reader = threading.Thread(target=self._read, name="hypic-api-recv", daemon=True)
        self._reader.start()
        _LIVE.add(self)

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def start(
        cls,
        settings: Settings,
        *,
        model: str | None = None,
        progress: Progress_ | None = None,
        warm_start: bool = False,
        triton_dir: str | None = None,
        log_json: bool = False,
    ) -> EngineClient:
        """Spawn the engine process and wait for it to be ready (its start-up stages go to ``progress``);
        raises what ended its start-up (a ``HypicError`` for a model it cannot load, a ``DeviceError``
        ...), the process then gone."""
        ctx = mp.get_context("spawn")
        parent_end, child_end = ctx.Pipe(duplex=True)
        options = core.CoreOptions(os.getpid(), warm_start=warm_start, triton_dir=triton_dir, log_json=log_json)
        # not a daemon: daemonic processes may not start children (the engine's scatter workers)
        proc = ctx.Process(target=core.main, args=(child_end, settings, model, options), name="hypic-engine")
        proc.start()
        child_end.close()  # its only copy is the engine process's: its death closes the pipe here
        log.info("engine process started", extra={"fields": {"pid": proc.pid}})
        client = cls(settings, proc, parent_end, progress)
        try:
            while not client._ready.wait(0.5):
                pass
            if client._start_error is not None:
                raise client._start_error
            if client.facts is None:  # it died before Ready without a word
                raise EngineDeadError(client._dead or f"the engine process (pid {proc.pid}) did not start")
        except BaseException:
            client.close()
            raise
        client._progress = None
        return client

    def close(self, timeout: float = SHUTDOWN_TIMEOUT_S) -> None:
        """Stop the engine process (``Shutdown``, then SIGTERM / SIGKILL if it does not exit); idempotent."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
        _LIVE.discard(self)
        if self.proc.is_alive():
            self._out.put(Shutdown())
            self.proc.join(timeout if self.facts is not None else 0.5)
        for stop in (self.proc.terminate, self.proc.kill):
            if not self.proc.is_alive():
                break
            stop()
            self.proc.join(5)
        self._out.close(1.0)
        self._reader.join(5)
        with contextlib.suppress(OSError):
            self._conn.close()
        log.info("engine process stopped", extra={"fields": {"pid": self.pid, "exitcode": self.proc.exitcode}})

    @property
    def alive(self) -> bool:
        return self._dead is None and not self._closing

    def status(self) -> EngineStatus:
        return EngineStatus(self.pid, self.alive, self.proc.exitcode, self._dead)

    # ------------------------------------------------------------------ requests
    def pieces(
        self, plan: PlanLike, *, mode: str | None = None, seam: float | str | None = None, max_new_tokens: int = 0
    ) -> PromptPieces:
        """``Engine.pieces`` (host-side only): the plan checked for its mode, seam and the context window."""
        assert self.facts is not None
        spec = mode_spec(mode or self.settings.default_mode)
        w = validate_seam(self.settings.default_seam if seam is None else seam)
        return make_pieces(
            plan,
            spec,
            w,
            max_context=self.facts.max_context,
            max_new_tokens=max_new_tokens,
            split_tokens=self.settings.split_segment_tokens,
        )

    def submit(
        self, req: GenerationRequest, sink: EventSink | None = None, hints: Mapping[str, Any] | None = None
    ) -> RemoteHandle:
        """Queue ``req`` on the engine process (``Scheduler.submit``'s contract, module doc)."""
        assert self.facts is not None
        sampling = req.sampling.validate()
        pieces = self.pieces(req.plan, mode=req.mode, seam=req.seam, max_new_tokens=sampling.max_tokens)
        if pieces.total + sampling.max_tokens > self.facts.seq_tokens:
            raise ContextLengthError(
                f"prompt ({pieces.total} tokens) + max_tokens ({sampling.max_tokens}) can never fit the state "
                f"pool ({self.facts.seq_tokens} tokens, HYPIC_KV_POOL_TOKENS); send fewer segments or lower max_tokens",
                param="max_tokens",
            )
        # without stop strings the engine sends ids only and this process makes the text (``detok``)
        here = not sampling.stop and self.tokenizer is not None
        wire = replace(req, plan=WirePlan.of(req.plan), sampling=replace(sampling, detokenize=not here))
        with self._lock:
            self._check_alive()
            rid = next(self._rids)
            handle = RemoteHandle(req, sink, rid, self._cancel, Detokenizer(self.tokenizer) if here else None)
            self._handles[rid] = handle
        self._out.put(Submit(rid, wire, time.perf_counter() - req.t0, dict(hints or {})))
        return handle

    def _cancel(self, rid: int) -> None:
        self._out.put(Cancel(rid))

    # ------------------------------------------------------------------ calls
    def call(self, method: str, *args: Any, timeout: float | None = CALL_TIMEOUT_S, **kwargs: Any) -> Any:
        """Run ``method`` in the engine process and return its result (or raise its exception there);
        blocking: not on an event loop. ``timeout`` None waits as long as the engine process lives."""
        pending = _Pending()
        with self._lock:
            self._check_alive()
            cid = next(self._cids)
            self._calls[cid] = pending
        self._out.put(Call(cid, method, args, kwargs))
        if not pending.done.wait(timeout):
            with self._lock:
                self._calls.pop(cid, None)
            raise ServiceUnavailableError(
                f"the engine process (pid {self.pid}) did not answer {method} within {timeout:g} s; retry later"
            )
        if not pending.ok:
            raise pending.value
        return pending.value

    def notify(self, method: str, *args: Any, **kwargs: Any) -> None:
        """``call`` without waiting for (or getting) the answer; nothing when the engine is gone."""
        if self.alive:
            self._out.put(Call(0, method, args, kwargs))

    def snapshot(self) -> ServingSnapshot | None:
        """The serving core's numbers (``/metrics``), None when the engine process is gone."""
        try:
            snap = self.call("snapshot", timeout=10.0)
        except ServiceUnavailableError:
            return None
        assert isinstance(snap, ServingSnapshot)
        return snap

    def _check_alive(self) -> None:
        """Under ``_lock``."""
        if self._dead is not None:
            raise EngineDeadError(self._dead)
        if self._closing:
            raise ServiceUnavailableError("the server is shutting down")

    def dead_error(self) -> EngineDeadError | None:
        return EngineDeadError(self._dead) if self._dead is not None else None

    # ------------------------------------------------------------------ the reader thread
    def _read(self) -> None:
        conn, sentinel = self._conn, self.proc.sentinel
        while True:
            try:
                ready = wait([conn, sentinel])
                if conn not in ready and not conn.poll(0):
                    break  # the process ended and nothing is left to read
                batch = conn.recv()
            except (EOFError, OSError):
                break
            except Exception:  # a message this process cannot read: nothing it says can be trusted
                log.exception("cannot read a message of the engine process (pid %d); stopping it", self.pid)
                self.proc.kill()
                break
            self.messages_received += 1
            for item in batch:
                try:
                    self._dispatch(item)
                except Exception:
                    log.exception("handling a message of the engine process failed")
        self._gone()

    def _dispatch(self, item: Any) -> None:
        if type(item) is tuple:
            rid, kind, payload = item
            self.events_received += 1
            with self._lock:
                handle = self._handles.get(rid) if kind != END else self._handles.pop(rid, None)
            if handle is None:
                return
            if kind in (EVENT, ERROR):
                handle.deliver(payload)
            elif kind == ADMITTED:
                handle.admitted(float(payload))
            else:
                handle.end()
        elif isinstance(item, Reply):
            with self._lock:
                pending = self._calls.pop(item.cid, None)
            if pending is not None:
                pending.set(item.ok, item.value)
        elif isinstance(item, Progress):
            if self._progress is not None:
                if item.done is None:
                    self._progress(item.msg)
                else:
                    self._progress(item.msg, done=item.done, total=item.total, unit=item.unit)
        elif isinstance(item, Ready):
            self.facts, self.tokenizer = item.facts, item.tokenizer
            self._ready.set()
        elif isinstance(item, StartFailed):
            self._start_error = item.error
            self._ready.set()

    def _gone(self) -> None:
        """The pipe closed: the engine process ended (or is being stopped). Fail everything waiting."""
        self.proc.join(5)
        if self.proc.is_alive():  # closed its end but still runs: it cannot serve any more
            self.proc.kill()
            self.proc.join(5)
        how = exit_description(self.proc.exitcode)
        with self._lock:
            closing = self._closing
            handles, self._handles = self._handles, {}
            calls, self._calls = self._calls, {}
            if not closing and self._dead is None and self._start_error is None:
                self._dead = (
                    f"the engine process (pid {self.pid}) {how}; this server cannot generate until it is "
                    "restarted (see its log)"
                )
        if closing:
            message = "the server is shutting down"
        elif self._start_error is not None:
            message = f"the engine process (pid {self.pid}) {how} during start-up"
            self._dead = self._dead or message
        else:
            log.error(
                "the engine process died",
                extra={"fields": {"pid": self.pid, "exitcode": self.proc.exitcode, "how": how,
                                  "requests_failed": len(handles), "calls_failed": len(calls)}},
            )  # fmt: skip
            message = (
                f"the engine process (pid {self.pid}) {how} while serving this request; retry once the server is "
                "restarted"
            )

        def error() -> ServiceUnavailableError:
            return ServiceUnavailableError(message) if closing else EngineDeadError(message)

        for handle in handles.values():
            handle.fail(error())
        for pending in calls.values():
            pending.set(False, error())
        self._ready.set()

    def _unsendable(self, item: Any, exc: BaseException) -> None:
        """An item that cannot be pickled (a constraint that is not a ``GrammarFactory``...): its request
        or call fails with the reason instead of waiting forever."""
        err = TypeError(f"cannot send this request to the engine process: {type(exc).__name__}: {exc}")
        rid = rid_of(item)
        if rid is not None:
            with self._lock:
                handle = self._handles.pop(rid, None)
            if handle is not None:
                handle.fail(err)
        elif isinstance(item, Call):
            with self._lock:
                pending = self._calls.pop(item.cid, None)
            if pending is not None:
                pending.set(False, err)


_LIVE: weakref.WeakSet[EngineClient] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    """No engine process outlives the API process, even one whose client was never closed (this hook
    runs before ``multiprocessing``'s, which would wait for it forever)."""
    for client in list(_LIVE):
        with contextlib.suppress(Exception):
            client.close(timeout=5.0)
