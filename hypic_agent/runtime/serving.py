"""``Serving``: an engine put to serve requests: its state pool, model runner and scheduler.

The engine prepares prompts (plan -> lookup -> cold builds -> combine) and knows nothing of
serving; whoever serves (the app's ``ServerState``, the CLI, a benchmark, a test) builds ONE
``Serving`` over it at start-up:

    engine -> Serving.of(engine) -> StatePool (allocated now) -> ModelRunner -> Scheduler

and submits requests to ``scheduler`` (or iterates ``generate``). One ``Serving`` per engine:
``Serving.of(engine)`` builds it on first use and hands the same one to every later caller (two
apps over one engine share its pool and scheduler); the engine only keeps the reference
(``Engine.serving``), it imports nothing of this. The scheduler's engine thread starts on a submit;
``stop`` ends it (the next submit starts it again), ``close`` also stops the engine's scatter
workers.
"""

from __future__ import annotations

from collections.abc import Iterator

from hypic_agent.runtime.engine import Engine
from hypic_agent.runtime.prompt_pieces import PlanLike
from hypic_agent.runtime.results import FinishEvent, TokenEvent
from hypic_agent.runtime.runner.pool import StatePool
from hypic_agent.runtime.runner.sizing import pool_sizes
from hypic_agent.runtime.sampling import SamplingParams
from hypic_agent.runtime.scheduler.request import GenerationRequest
from hypic_agent.runtime.scheduler.scheduler import Scheduler


def build_pool(engine: Engine) -> StatePool:
    """The state pool for ``engine``'s model, sized by its settings (``runner.sizing``)."""
    p = next(engine.model.parameters())
    s = engine.settings
    slots, kv_tokens = pool_sizes(engine.model.config, s, engine.max_context, p.device, p.dtype)
    return StatePool(
        engine.model.config,
        slots=slots,
        kv_tokens=kv_tokens,
        page_size=s.kv_page_size,
        device=p.device,
        dtype=p.dtype,
        max_seq_tokens=engine.max_context,
        snapshots=s.prefix_snapshots,
    )


class Serving:
    """One engine's serving side: ``pool``, ``runner`` and ``scheduler`` (one engine thread)."""

    def __init__(self, engine: Engine) -> None:
        """Use ``Serving.of``: a second ``Serving`` of one engine raises ``RuntimeError``."""
        with engine.lock:
            if engine.serving is not None:
                raise RuntimeError("this engine is served already: Serving.of(engine) returns its Serving")
            self._build(engine)
            engine.serving = self

    @classmethod
    def of(cls, engine: Engine) -> Serving:
        """``engine``'s one ``Serving``, built (its pool allocated) on first use; thread-safe."""
        with engine.lock:
            if engine.serving is None:
                return cls(engine)
            assert isinstance(engine.serving, Serving)
            return engine.serving

    def _build(self, engine: Engine) -> None:
        self.engine = engine
        self.pool = build_pool(engine)
        graphs = engine.settings.cuda_graphs and self.pool.device.type == "cuda"
        self.runner = engine.runner  # the engine's one runner (its graphs), now over the pool
        self.runner.attach(self.pool, decode_graphs=graphs, max_batch=engine.settings.decode_graph_max_batch)
        self.scheduler = Scheduler(engine, self.runner, engine.settings)

    def generate(
        self,
        plan: PlanLike,
        sampling: SamplingParams,
        *,
        mode: str | None = None,
        seam: float | str | None = None,
        tenant: str = "default",
    ) -> Iterator[TokenEvent | FinishEvent]:
        """Submit to the scheduler and stream its events: ``TokenEvent``s then one ``FinishEvent``
        (closing the iterator early cancels the request)."""
        yield from self.scheduler.generate(GenerationRequest(plan, sampling, mode, seam, tenant))

    def stop(self) -> None:
        """Stop the engine thread (if it was started; a later submit starts it again)."""
        self.scheduler.shutdown()

    def close(self) -> None:
        """``stop``, then the engine's scatter workers (if any)."""
        self.stop()
        self.engine.close()
