"""``ServerState``: what one app instance holds (engine and its serving side, store, cache adapter,
metrics, auth).

Built by the app's lifespan (``app.py``) and reached from routes via ``request.app.state.hypic``.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from hypic_agent.api.auth import KeyAuth, RateLimiter
from hypic_agent.api.errors import ServiceUnavailableError
from hypic_agent.api.limits import StoreBudget, new_entry_tokens, put_pieces
from hypic_agent.api.metrics import Metrics
from hypic_agent.api.metrics_serving import ServingCollector
from hypic_agent.config import Settings
from hypic_agent.runtime.engine import Engine
from hypic_agent.runtime.hypic.store_cache import StoreEntryCache
from hypic_agent.runtime.serving import Serving
from hypic_agent.segments.prompt.framing import Framer
from hypic_agent.segments.store.segment_store import SegmentStore


@dataclass
class ServerState:
    settings: Settings
    engine: Engine
    serving: Serving  # the engine's state pool, runner and scheduler (one per app)
    store: SegmentStore
    cache: StoreEntryCache
    metrics: Metrics
    auth: KeyAuth
    limiter: RateLimiter
    framer: Framer
    store_budget: StoreBudget
    owns_store: bool = False
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
        metrics.registry.register(ServingCollector(serving.scheduler, engine.scatter_pool))
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

    def admit_prompt(self, plan: Any, mode: str, seam: float | str, tenant: str, max_new_tokens: int = 0) -> int:
        """Charge the entries a prompt would add to the store to ``tenant`` (``StoreBudget``): 413 /
        429 before anything is built. Call after the plan is checked, before the job is submitted."""
        pieces = self.engine.pieces(plan, mode=mode, seam=seam, max_new_tokens=max_new_tokens)
        return self.store_budget.admit(tenant, new_entry_tokens(self.engine, self.store, pieces, tenant))

    def admit_put(self, segments: Any, mode: str, seam: float, tenant: str) -> int:
        """``admit_prompt`` for a PUT of canonical ``segments`` (those it pre-warms), keyed as
        ``Engine.prewarm`` keys them."""
        if not segments:
            return 0
        pieces = put_pieces(self.engine, [s.token_ids for s in segments], [s.kind for s in segments], mode, seam)
        return self.store_budget.admit(tenant, new_entry_tokens(self.engine, self.store, pieces, tenant, every=True))

    @contextmanager
    def engine_slot(self) -> Any:
        """Hold the engine (its re-entrant lock) for one piece of model work outside the scheduler
        (a segment PUT's prewarm): the scheduler takes the same lock per step, so this waits at
        most one step. Yields the ms spent waiting.

        NOTE: acquire and release happen on the same thread (the worker running the request)."""
        with self._depth_lock:
            self._depth += 1
            self.metrics.queue_depth.set(self._depth)
        t0 = time.perf_counter()
        try:
            with self.engine.lock:
                yield (time.perf_counter() - t0) * 1e3
        finally:
            with self._depth_lock:
                self._depth -= 1
                self.metrics.queue_depth.set(self._depth)

    def close(self) -> None:
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
