"""``ServerState``: what one app instance holds (engine and its serving side, store, cache adapter,
metrics, auth).

Built by the app's lifespan (``app.py``) and reached from routes via ``request.app.state.hypic``.
Two shapes, one interface for the routes (``submit``, ``describe``, ``prewarm``, ``admit_*``):

* in-process (``build``): ``engine`` is the ``Engine``, ``serving`` its ``Serving``, ``store`` the
  ``SegmentStore``, ``cache`` the engine's ``StoreEntryCache``;
* engine process (``remote``, ``Settings.engine_process``): ``core`` is the ``EngineClient``, ``engine``
  a ``RemoteEngine`` (facts and tokenizer only), ``store`` a ``RemoteStore`` (calls over the pipe);
  ``serving`` and ``cache`` are None (they live in the engine process).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from hypic_agent.api.auth import KeyAuth, RateLimiter
from hypic_agent.api.errors import ServiceUnavailableError
from hypic_agent.api.limits import EntrySize, StoreBudget, new_entry_tokens, put_pieces
from hypic_agent.api.metrics import Metrics
from hypic_agent.api.metrics_serving import ServingCollector
from hypic_agent.config import Settings
from hypic_agent.runtime.core_process import EngineClient, RemoteEngine, RemoteStore, ServingSnapshot
from hypic_agent.runtime.engine import Engine
from hypic_agent.runtime.hypic.store_cache import EntryHint, StoreEntryCache
from hypic_agent.runtime.prompt_pieces import PromptPieces
from hypic_agent.runtime.results import SegmentUsage
from hypic_agent.runtime.scheduler.request import EventSink, GenerationRequest, RequestHandle
from hypic_agent.runtime.serving import Serving
from hypic_agent.segments.prompt.framing import Framer
from hypic_agent.segments.store.segment_store import SegmentStore


@dataclass
class ServerState:
    settings: Settings
    engine: Engine | RemoteEngine
    serving: Serving | None  # the engine's state pool, runner and scheduler (one per app); None: engine process
    store: SegmentStore | RemoteStore
    cache: StoreEntryCache | None  # None: the entry cache is the engine process's
    metrics: Metrics
    auth: KeyAuth
    limiter: RateLimiter
    framer: Framer
    store_budget: StoreBudget
    owns_store: bool = False
    core: EngineClient | None = None  # the engine process (Settings.engine_process), None: in-process
    started_at: float = field(default_factory=time.time)
    _depth: int = 0
    _depth_lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def build(
        cls,
        settings: Settings,
        engine: Engine,
        store: SegmentStore,
        metrics: Metrics,
        owns_store: bool,
    ) -> Any:
        """The app's state over ``engine`` and its one ``Serving`` (built now, at start-up, if no
        earlier app or pre-warm built it: ``Serving.of``)."""
        cache = engine.cache
        if not (isinstance(cache, StoreEntryCache) and cache.store is store):
            cache = StoreEntryCache(store, engine.model.config.layer_types, engine.fingerprint)
            engine.cache = cache
        cache.on_insert = lambda _key: metrics.cold.inc()
        serving = Serving.of(engine)  # the state pool is allocated now (not on the first request)
        metrics.registry.register(ServingCollector(lambda: ServingSnapshot.of(serving.scheduler, engine.scatter_pool)))
        return cls(
            settings=settings,
            engine=engine,
            serving=serving,
            store=store,
            cache=cache,
            metrics=metrics,
            auth=KeyAuth(settings.api_keys),
            limiter=RateLimiter(settings.tenant_requests_per_minute),
            framer=Framer(engine.tokenizer),
            store_budget=StoreBudget.for_engine(settings, engine),
            owns_store=owns_store,
        )

    @classmethod
    def remote(cls, settings: Settings, core: EngineClient, metrics: Metrics) -> ServerState:
        """The app's state over the engine process ``core`` (ready): its engine and store reached over
        the pipe, its serving numbers read at scrape time. ``close`` stops the engine process."""
        engine = RemoteEngine(core)
        facts = core.facts
        assert facts is not None
        cold_seen = [0]  # the engine process's cold stores already counted into metrics.cold

        def snapshot() -> ServingSnapshot | None:
            snap = core.snapshot()
            if snap is not None and snap.cold_inserts > cold_seen[0]:
                metrics.cold.inc(snap.cold_inserts - cold_seen[0])
                cold_seen[0] = snap.cold_inserts
            return snap

        collector = ServingCollector(snapshot)
        metrics.before_render.append(collector.refresh)  # hypic_cold_segments is current in the same scrape
        metrics.registry.register(collector)
        size = EntrySize(facts.entry_per_segment, facts.entry_per_token)
        return cls(
            settings=settings,
            engine=engine,
            serving=None,
            store=RemoteStore(core),
            cache=None,
            metrics=metrics,
            auth=KeyAuth(settings.api_keys),
            limiter=RateLimiter(settings.tenant_requests_per_minute),
            framer=Framer(engine.tokenizer),
            store_budget=StoreBudget.for_size(settings, size, facts.max_context),
            owns_store=True,
            core=core,
        )

    @property
    def vocab_size(self) -> int:
        e = self.engine
        return e.vocab_size if isinstance(e, RemoteEngine) else int(e.model.config.vocab_size)

    # ------------------------------------------------------------------ requests
    def submit(
        self, req: GenerationRequest, sink: EventSink | None = None, hints: Mapping[str, EntryHint] | None = None
    ) -> RequestHandle:
        """Queue ``req`` on the scheduler (``Scheduler.submit``: 4xx / 429 raised before anything runs).
        ``hints``: its registry hints; in-process the caller holds them (``describe``), the engine
        process holds them itself for the request's life."""
        if self.core is not None:
            return self.core.submit(req, sink, hints)
        assert self.serving is not None
        return self.serving.scheduler.submit(req, sink)

    def describe(self, hints: Mapping[str, EntryHint]) -> Any:
        """A context holding ``hints`` for a request's duration (``StoreEntryCache.described``); with the
        engine process a no-op here: the hints go with ``submit``."""
        return self.cache.described(hints) if self.cache is not None else nullcontext()

    def prewarm(
        self,
        segments: Sequence[Sequence[int]],
        kinds: Sequence[str],
        *,
        tenant: str,
        mode: str | None,
        seam: float | str | None,
        hints: Mapping[str, EntryHint],
    ) -> list[SegmentUsage]:
        """``Engine.prewarm`` between scheduler steps (``engine_slot``), with ``hints`` held while it stores."""
        e = self.engine
        if isinstance(e, RemoteEngine):
            with self._queued():
                return e.prewarm(segments, kinds, tenant=tenant, mode=mode, seam=seam, hints=hints)
        with self.engine_slot(), self.describe(hints):
            return e.prewarm(segments, kinds, tenant=tenant, mode=mode, seam=seam)

    def admit_prompt(self, plan: Any, mode: str, seam: float | str, tenant: str, max_new_tokens: int = 0) -> int:
        """Charge the entries a prompt would add to the store to ``tenant`` (``StoreBudget``): 413 /
        429 before anything is built. Call after the plan is checked, before the job is submitted."""
        pieces = self.engine.pieces(plan, mode=mode, seam=seam, max_new_tokens=max_new_tokens)
        return self.store_budget.admit(tenant, self._new_entry_tokens(pieces, tenant))

    def admit_put(self, segments: Any, mode: str, seam: float, tenant: str) -> int:
        """``admit_prompt`` for a PUT of canonical ``segments`` (those it pre-warms), keyed as
        ``Engine.prewarm`` keys them."""
        if not segments:
            return 0
        split = self.settings.split_segment_tokens
        pieces = put_pieces(split, [s.token_ids for s in segments], [s.kind for s in segments], mode, seam)
        return self.store_budget.admit(tenant, self._new_entry_tokens(pieces, tenant, every=True))

    def _new_entry_tokens(self, pieces: PromptPieces, tenant: str, every: bool = False) -> list[int]:
        if not pieces.spec.composed or not self.store_budget.capped:
            return []  # nothing to store, or nothing to check it against
        e = self.engine
        if isinstance(e, RemoteEngine):  # keys and the store's contents are the engine process's
            return e.entry_tokens(pieces, tenant, every)
        return new_entry_tokens(e, self.store, pieces, tenant, every=every)

    @contextmanager
    def _queued(self) -> Iterator[None]:
        """Counts the request in ``hypic_queue_depth`` while it waits for or runs model work."""
        with self._depth_lock:
            self._depth += 1
            self.metrics.queue_depth.set(self._depth)
        try:
            yield
        finally:
            with self._depth_lock:
                self._depth -= 1
                self.metrics.queue_depth.set(self._depth)

    @contextmanager
    def engine_slot(self) -> Any:
        """Hold the engine (its re-entrant lock) for one piece of model work outside the scheduler
        (a segment PUT's prewarm): the scheduler takes the same lock per step, so this waits at
        most one step. Yields the ms spent waiting. In-process only.

        NOTE: acquire and release happen on the same thread (the worker running the request)."""
        e = self.engine
        assert isinstance(e, Engine), "the engine process takes its own lock (EngineCore.prewarm)"
        with self._queued():
            t0 = time.perf_counter()
            with e.lock:
                yield (time.perf_counter() - t0) * 1e3

    def close(self) -> None:
        if self.core is not None:
            self.core.close()  # the engine process stops its scheduler and closes the store
            return
        assert self.serving is not None
        self.serving.close()  # the engine thread, then the engine's scatter workers
        if self.owns_store:
            self.store.close()
        else:
            self.store.flush()


def get_state(request: Request) -> ServerState:
    st = getattr(request.app.state, "hypic", None)
    if st is None:
        raise ServiceUnavailableError("the server is still starting (model loading); retry in a moment")
    return st
