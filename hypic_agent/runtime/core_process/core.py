"""The engine process: the model, its ``Serving`` (state pool, runner, scheduler) and the segment store,
answering the API process over one pipe (``client.EngineClient`` starts it; messages: ``protocol``).

``main`` (the spawn target) builds, on a start-up thread that exits (``runtime.main_thread``), what
``hypic-agent serve`` builds in-process: ``load_engine`` (each stage sent back as ``Progress``), the
segment store and the engine's ``StoreEntryCache`` over it, ``Serving.of(engine)``, the warm start
when asked; then sends ``Ready`` (``EngineFacts`` and the tokenizer) and reads messages on the main
thread until ``Shutdown`` or until the API process's end of the pipe closes:

* ``Submit`` goes straight to ``Scheduler.submit`` with a sink per request that queues the request's
  events on the ``Outbox``; its sender thread sends whatever was queued as one message, so the pipe
  costs one send per decode step, not one per token. A request's registry hints are held by the
  entry cache from its submit until its last event (``StoreEntryCache.described``), as
  ``api.job_stream`` holds them in-process; a ``GrammarFactory`` constraint is bound to this
  process's compiled grammar before the request is queued;
* ``Call`` runs on a small thread pool, not on the loop (a segment PUT's pre-warm waits for the
  engine between steps and must not hold up the submits behind it; pre-warms have threads of their
  own, so no store call waits behind one): ``CALLS`` are the store's methods the API uses plus
  ``prewarm``, ``entry_tokens`` (the store budget's estimate) and ``snapshot`` (``/metrics``).

Where the segment store lives: here, in the engine process, and only here. ``SegmentStore`` is one
object per store folder and process (its docstring): it keeps a live index of every entry, the memory
tiers' tensors (GPU and pinned CPU, which only this process can hold or serve), budgets and eviction
scores, buffered hit counts, and single-flight state, none of it in the registry; SQLite WAL would
let a second process read rows, but those rows would be stale (tiers, hits, entries being built) and
its writes would race this process's eviction. Entries are written here by the engine's entry cache
during requests; the API process reaches the few store calls it needs (``info``, ``stats``,
``register``, ``set_policy``, ``list_entries``, ``delete``, ``check_pin_room``, ``contains``,
``flush``) through ``api_store.RemoteStore`` over the same pipe. Nothing is lost when the engine
process dies: every entry is written through to the disk tier when it is stored, and the next
start's ``SegmentStore.open`` recovers the registry and the files as after any crash (only hit
counts not yet flushed, at most ``hit_flush_interval_s`` old, are lost; a clean shutdown flushes).

Its end: ``Shutdown`` (the API's lifespan ends) or the pipe closing (the API process died) stop the
scheduler's engine thread and the scatter workers and close the store. A watcher thread also checks
that the parent process is still the one that started it: a parent killed while the model loads
(when nothing reads the pipe yet) still ends this process. SIGINT is ignored here: Ctrl-C reaches the
whole process group, and the API process stops this one in order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from hypic_agent.config import Settings
from hypic_agent.errors import HypicError
from hypic_agent.runtime.constraints.factory import GrammarFactory
from hypic_agent.runtime.core_process.facts import EngineFacts
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
    StartFailed,
    Submit,
    portable,
)
from hypic_agent.runtime.core_process.snapshot import ServingSnapshot
from hypic_agent.runtime.results import FinishEvent
from hypic_agent.runtime.sampling import SamplingParams
from hypic_agent.runtime.scheduler.request import END as SCHED_END
from hypic_agent.runtime.scheduler.request import RequestHandle

log = logging.getLogger("hypic.core")

CALLS = ("info", "stats", "register", "set_policy", "list_entries", "delete", "check_pin_room", "contains", "flush")
"""The ``SegmentStore`` methods the API process may call (as ``store.<name>``)."""
MODEL_CALLS = frozenset({"prewarm"})
"""Calls that do model work: run on their own threads, so a long pre-warm delays no store call."""
CALL_THREADS = 4
PARENT_POLL_S = 0.5
PARENT_GRACE_S = 10.0  # a serving engine whose parent died gets this long to close the store itself


@dataclass(frozen=True)
class CoreOptions:
    parent_pid: int
    warm_start: bool = False  # run ``warm_start_stage`` before Ready (``serve``)
    triton_dir: str | None = None  # where ``serve`` keeps Triton's caches (said in the warm start's line)
    log_json: bool = False  # JSON log lines on stderr (``serve``); else logging is left as it is


def main(conn: Connection, settings: Settings, model: str | None, options: CoreOptions) -> None:
    """The engine process (the spawn target of ``EngineClient.start``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if options.log_json:
        from hypic_agent.api.logs import configure_logging

        configure_logging(settings.log_level)
        for handler in logging.getLogger().handlers:
            handler.addFilter(_tag_engine_process)
    if settings.switch_interval_ms is not None:
        sys.setswitchinterval(settings.switch_interval_ms / 1e3)

    def unsendable(item: Any, exc: BaseException) -> None:
        out.put(_as_error(item, exc))

    out = Outbox(conn, "hypic-core-send", on_unsendable=unsendable)
    watch = ParentWatch(options.parent_pid)
    watch.start()
    try:
        core = EngineCore.start(settings, model, options, out)
    except BaseException as exc:
        log.exception("the engine process could not start")
        out.put(StartFailed(portable(exc), traceback.format_exc()))
        out.close()
        return
    try:
        out.put(Ready(core.facts, core.engine.tokenizer))
        watch.serving = True
        core.serve(conn)
    finally:
        core.close()
        out.close()


def _tag_engine_process(record: logging.LogRecord) -> bool:
    """Every log line of the engine process says so (``"process": "engine"``, its pid): the two
    processes write to the same stderr."""
    fields = getattr(record, "fields", None)
    record.fields = {**(fields if isinstance(fields, dict) else {}), "process": "engine", "pid": os.getpid()}
    return True


def _as_error(item: Any, exc: BaseException) -> Any:
    """What goes instead of an item that cannot be pickled: the error, to whoever waits for the item."""
    err = RuntimeError(f"the engine process cannot send its answer to the API process ({type(exc).__name__}: {exc})")
    if isinstance(item, Reply):
        return Reply(item.cid, False, err)
    if isinstance(item, Ready):
        return StartFailed(err, "")
    if isinstance(item, tuple):
        return (item[0], ERROR, err)
    return Progress(str(err))


class ParentWatch(threading.Thread):
    """Ends this process once its parent is gone: at once while the model loads (nothing reads the
    pipe then), after ``PARENT_GRACE_S`` while serving (the closed pipe already stops the loop, which
    closes the store)."""

    def __init__(self, parent_pid: int) -> None:
        super().__init__(name="hypic-core-parent", daemon=True)
        self.parent_pid = parent_pid
        self.serving = False

    def run(self) -> None:
        while os.getppid() == self.parent_pid:
            time.sleep(PARENT_POLL_S)
        log.error("the API process (pid %d) is gone; the engine process (pid %d) exits", self.parent_pid, os.getpid())
        if self.serving:
            time.sleep(PARENT_GRACE_S)
        os._exit(1)


@dataclass
class _Live:
    """One submitted request, engine side: its scheduler handle and the registry hints it holds."""

    hints: contextlib.ExitStack
    handle: RequestHandle | None = None
    admitted_sent: bool = False

    def release(self) -> None:
        self.hints.close()


class EngineCore:
    def __init__(self, settings: Settings, engine: Any, store: Any, cache: Any, serving: Any, out: Outbox) -> None:
        from hypic_agent.api.limits import EntrySize  # the store budget's entry layout (API side estimate)

        self.settings, self.engine, self.store, self.cache, self.serving, self.out = (
            settings,
            engine,
            store,
            cache,
            serving,
            out,
        )
        self.facts = EngineFacts.of(engine, serving, EntrySize.of_model(engine.model, engine.cold.pair_dtype))
        self.live: dict[int, _Live] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=CALL_THREADS, thread_name_prefix="hypic-core-call")
        # model work (a PUT's pre-warm waits for the engine between steps) apart: store calls never queue behind it
        self._model_pool = ThreadPoolExecutor(max_workers=CALL_THREADS, thread_name_prefix="hypic-core-prewarm")
        self.cold_inserts = 0
        cache.on_insert = self._count_insert
        self.methods: dict[str, Callable[..., Any]] = {f"store.{name}": getattr(store, name) for name in CALLS}
        self.methods.update(prewarm=self.prewarm, entry_tokens=self.entry_tokens, snapshot=self.snapshot)

    @classmethod
    def start(cls, settings: Settings, model: str | None, options: CoreOptions, out: Outbox) -> EngineCore:
        """Load and open everything (on a start-up thread that exits: ``off_main_thread``)."""
        from hypic_agent.runtime.hypic.store_cache import StoreEntryCache
        from hypic_agent.runtime.loader import load_engine
        from hypic_agent.runtime.main_thread import off_main_thread
        from hypic_agent.runtime.serving import Serving
        from hypic_agent.runtime.warm_start import warm_start_stage
        from hypic_agent.segments.store.segment_store import SegmentStore

        def progress(msg: str, *, done: int | None = None, total: int | None = None, unit: str = "B") -> None:
            out.put(Progress(msg, done, total, unit))

        def build() -> EngineCore:
            engine = load_engine(settings, model=model, progress=progress)
            try:
                pickle.dumps(engine.tokenizer)
            except Exception as exc:
                engine.close()
                raise RuntimeError(
                    f"the tokenizer of {engine.name} cannot be sent to the API process ({exc}); serve it in one "
                    "process: HYPIC_ENGINE_PROCESS=false"
                ) from exc
            progress(f"opening the segment store under {settings.resolved_store_dir()}")
            store = SegmentStore.from_settings(settings)
            try:
                cache = StoreEntryCache(store, engine.model.config.layer_types, engine.fingerprint)
                engine.cache = cache
                serving = Serving.of(engine)  # the state pool is allocated now
                if options.warm_start:
                    warm_start_stage(serving, progress, options.triton_dir)
                return cls(settings, engine, store, cache, serving, out)
            except BaseException:
                engine.close()
                store.close()
                raise

        return off_main_thread(build)

    # ------------------------------------------------------------------ the loop
    def serve(self, conn: Connection) -> None:
        """Answer messages until ``Shutdown`` or the API process's end of the pipe closes."""
        while True:
            try:
                batch = conn.recv()
            except (EOFError, OSError):
                log.warning("the API process closed the pipe; the engine process (pid %d) stops", os.getpid())
                return
            for item in batch:
                if isinstance(item, Submit):
                    self._submit(item)
                elif isinstance(item, Cancel):
                    self._cancel(item.rid)
                elif isinstance(item, Call):
                    (self._model_pool if item.method in MODEL_CALLS else self._pool).submit(self._answer, item)
                else:  # Shutdown
                    log.info("engine process (pid %d) shutting down", os.getpid())
                    return

    def close(self) -> None:
        """Stop the engine thread and the scatter workers, finish running calls, close the store."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._model_pool.shutdown(wait=True, cancel_futures=True)
        try:
            self.serving.close()
        finally:
            self.store.close()

    # ------------------------------------------------------------------ requests
    def _submit(self, m: Submit) -> None:
        live = _Live(contextlib.ExitStack())
        live.hints.enter_context(self.cache.described(m.hints))
        with self._lock:
            self.live[m.rid] = live
        sink = self._sink_of(m.rid, live)
        try:
            req = m.request
            req = dataclasses.replace(req, sampling=self._bind(req.sampling), t0=time.perf_counter() - m.age_s)
            live.handle = self.serving.scheduler.submit(req, sink)
        except BaseException as exc:  # refused (4xx, queue full): the API raises it at its first event
            sink(exc)
            sink(SCHED_END)

    def _sink_of(self, rid: int, live: _Live) -> Callable[[Any], None]:
        put = self.out.put

        def sink(item: Any) -> None:  # the scheduler's engine thread
            if item is SCHED_END:
                with self._lock:
                    self.live.pop(rid, None)
                live.release()
                put((rid, END, None))
            elif isinstance(item, BaseException):
                put((rid, ERROR, portable(item)))
            else:
                if not live.admitted_sent and live.handle is not None:
                    live.admitted_sent = True
                    put((rid, ADMITTED, live.handle.queue_ms))
                if isinstance(item, FinishEvent) and item.prepared.state is not None:
                    item = dataclasses.replace(item, prepared=dataclasses.replace(item.prepared, state=None))
                put((rid, EVENT, item))

        return sink

    def _cancel(self, rid: int) -> None:
        with self._lock:
            live = self.live.get(rid)
        if live is not None and live.handle is not None:
            live.handle.cancel()

    def _bind(self, sampling: SamplingParams) -> SamplingParams:
        c = sampling.constraint
        if isinstance(c, GrammarFactory) and not c.bound:
            from hypic_agent.runtime.constraints import grammars_for

            e = self.engine
            grammars = grammars_for(
                e.tokenizer, int(e.model.config.vocab_size), e.eos_ids, self.settings.grammar_cache_size
            )
            c.bind(grammars, e.tokenizer)
        return sampling

    def _count_insert(self, _key: str) -> None:
        self.cold_inserts += 1  # the engine thread's (and pre-warms') stores; read by ``snapshot``

    # ------------------------------------------------------------------ calls
    def _answer(self, call: Call) -> None:
        try:
            fn = self.methods.get(call.method)
            if fn is None:
                raise ValueError(f"the engine process has no call {call.method!r}")
            value, ok = fn(*call.args, **call.kwargs), True
        except BaseException as exc:
            if not isinstance(exc, HypicError):
                log.exception("engine call %s failed", call.method)
            value, ok = portable(exc), False
        if call.cid:
            self.out.put(Reply(call.cid, ok, value))

    def prewarm(
        self,
        segments: list[tuple[int, ...]],
        kinds: list[str],
        *,
        tenant: str,
        mode: str | None,
        seam: float | str | None,
        hints: dict[str, Any] | None = None,
    ) -> Any:
        """``Engine.prewarm`` between scheduler steps (the engine's lock, as ``ServerState.engine_slot``),
        with the PUT's registry hints held."""
        with self.engine.lock, self.cache.described(hints or {}):
            return self.engine.prewarm(segments, kinds, tenant=tenant, mode=mode, seam=seam)

    def entry_tokens(self, pieces: Any, tenant: str, every: bool = False) -> list[int]:
        """``api.limits.new_entry_tokens``: the entries a prompt (or PUT) would add to the store."""
        from hypic_agent.api.limits import new_entry_tokens

        return new_entry_tokens(self.engine, self.store, pieces, tenant, every=every)

    def snapshot(self) -> ServingSnapshot:
        return ServingSnapshot.of(self.serving.scheduler, self.engine.scatter_pool, self.cold_inserts)
