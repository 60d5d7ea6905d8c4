"""The engine: ``plan -> lookup -> route cold segments -> scatter prefill -> store -> combine -> decode``.

With one scatter worker (the default) the cold segments of a composed request are built inside
its combine forward instead (``combine(..., cold=ColdBatch)``, ``Settings.fuse_cold_builds``) and
stored after it: same entries and logits, one read of the weights per layer instead of two. With
``Settings.scatter_workers > 1`` they are built on a ``WorkerPool`` of worker processes, each with
a replica of the model on its own device (``runtime.workers``), and stored as they come back.

``Engine.prepare`` turns a prompt plan into a ``RequestState`` in the requested mode (served
through the scheduler, a composed request's state goes straight into the state pool: ``into``).
The engine serves nothing itself: ``runtime.serving.Serving`` puts one to serve (state pool, model
runner, scheduler). Model work is serialized by the engine's lock, which also makes concurrent
requests needing the same cold segment share one prefill (the second finds the entry the first
stored). A plan is validated into ``PromptPieces`` once (``runtime.prompt_pieces``); a composed
prompt's seams and entry keys come from its ``SeamPlanner`` (``hypic.seam_plan``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from hypic_agent.config import Settings
from hypic_agent.errors import InvalidRequestError
from hypic_agent.runtime.cold_builds import ColdBuilds, with_built
from hypic_agent.runtime.headroom import AllocatorHeadroom
from hypic_agent.runtime.hypic.auto_seams import ProfileTable
from hypic_agent.runtime.hypic.blend import BlendPlan
from hypic_agent.runtime.hypic.build_context import BuildContext
from hypic_agent.runtime.hypic.cache import EntryCache, MemoryEntryCache
from hypic_agent.runtime.hypic.combine import combine
from hypic_agent.runtime.hypic.layout import plan_layout
from hypic_agent.runtime.hypic.modes import Strategy, mode_spec, validate_seam
from hypic_agent.runtime.hypic.seam_plan import SeamPlanner
from hypic_agent.runtime.models.hybrid import HybridForCausalLM
from hypic_agent.runtime.prompt_pieces import PlanLike, PromptPieces, make_pieces, split_for
from hypic_agent.runtime.results import Prepared, SegmentUsage, fold_pieces, full_prepared
from hypic_agent.runtime.router import route
from hypic_agent.runtime.runner.destination import StateDestination
from hypic_agent.runtime.runner.graph_set import GraphSet
from hypic_agent.runtime.runner.runner import ModelRunner
from hypic_agent.runtime.runner.standalone import prefill
from hypic_agent.runtime.workers.pool import WorkerPool


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1e3


class Engine:
    def __init__(
        self,
        model: HybridForCausalLM,
        tokenizer: Any,
        fingerprint: str,
        settings: Settings | None = None,
        cache: EntryCache | None = None,
        name: str = "model",
        model_spec: str | None = None,
    ) -> None:
        """``model_spec``: what the model was loaded from when not ``settings.model`` (scatter
        workers load their replicas from it; they check that their fingerprint is ``fingerprint``)."""
        self.model = model
        self.tokenizer = tokenizer
        self.fingerprint = fingerprint
        self.settings = settings or Settings()
        # the kernel choices, handed down: to the model's modules (MoE, norms), the layer graphs'
        # buckets, every combine (and its graphs) and the cold-build routing
        self.kernels = self.settings.kernels.config()
        model.set_kernels(self.kernels)
        if self.kernels.fuse_projections:
            model.fuse_projections()
        self.cache: EntryCache = cache if cache is not None else MemoryEntryCache(self.settings.cpu_budget_bytes)
        self.name = name
        self.device = next(model.parameters()).device
        self.lock = threading.RLock()
        self.max_context = min(self.settings.max_context, model.config.max_position_embeddings)
        # the one runner of this model: every forward and every CUDA graph (``Serving`` gives it the pool)
        self.runner = ModelRunner(model, graphs=GraphSet.of(model, self.settings, self.kernels, self.device))
        self.headroom = AllocatorHeadroom(self.device, self.settings.cuda_headroom_bytes)
        self.serving: object | None = None  # its ``runtime.serving.Serving`` (one per engine), set there
        self.seams = SeamPlanner(model, tokenizer, fingerprint, self.settings, self.lock)
        self.build_context()  # raises now on a prefix this tokenizer has no tokens for
        self.cold = ColdBuilds(
            model,
            self.settings,
            self.kernels,
            self.build_context,
            fingerprint=fingerprint,
            model_spec=model_spec,
            graphs=self.runner.graphs,
        )

    @property
    def scatter_pool(self) -> WorkerPool | None:
        """The scatter worker processes, or None (cold segments built in this process)."""
        return self.cold.pool

    @property
    def eos_ids(self) -> tuple[int, ...]:
        ids = set(self.model.config.eos_token_ids)
        tok_eos = getattr(self.tokenizer, "eos_token_id", None)
        if tok_eos is not None:
            ids.add(int(tok_eos))
        return tuple(sorted(ids))

    @property
    def seam_profiles(self) -> ProfileTable:
        """Per-segment deviation profiles that ``seam="auto"`` / ``"blend"`` plan from."""
        return self.seams.profiles

    def build_context(self) -> BuildContext:
        """The tokens cold segments are prefilled after (``Settings.build_prefix``)."""
        return self.seams.build_context()

    def entry_key(self, token_ids: Sequence[int], tenant: str, seam: float) -> str:
        """The key of a segment's entry (``SeamPlanner.entry_key``)."""
        return self.seams.entry_key(token_ids, tenant, seam)

    # ------------------------------------------------------------------ prepare
    def pieces(
        self, plan: PlanLike, *, mode: str | None = None, seam: float | str | None = None, max_new_tokens: int = 0
    ) -> PromptPieces:
        """Validate ``plan`` for ``mode`` and split it into cacheable segments and the suffix (no
        model work): raises ``InvalidRequestError`` / ``ContextLengthError`` / ``UnknownModeError``."""
        spec = mode_spec(mode or self.settings.default_mode)
        w = validate_seam(self.settings.default_seam if seam is None else seam)
        split = self.settings.split_segment_tokens
        return make_pieces(
            plan, spec, w, max_context=self.max_context, max_new_tokens=max_new_tokens, split_tokens=split
        )

    def prepare(
        self,
        plan: PlanLike,
        *,
        mode: str | None = None,
        seam: float | str | None = None,
        tenant: str = "default",
        max_new_tokens: int = 0,
    ) -> Prepared:
        """The prompt as a standalone ``RequestState`` (with ``last_logits``) in ``mode``."""
        return self.prepare_pieces(self.pieces(plan, mode=mode, seam=seam, max_new_tokens=max_new_tokens), tenant)

    def prepare_pieces(
        self, p: PromptPieces, tenant: str = "default", into: StateDestination | None = None
    ) -> Prepared:
        """``p`` prepared in its mode, outside the scheduler (measurements, the combine as a standalone
        state). ``into`` (composed modes only): the combine writes the state into a slot and pages of a
        state pool; ``Prepared.state`` then has no layers. ``prefix_cache`` lives in the scheduler's
        radix cache over the pool: serve it (``Serving.of(engine)``)."""
        if into is not None and not p.spec.composed:
            raise ValueError(f"{p.spec.name} prepares no state into the pool here (the scheduler runs its chunks)")
        if p.spec.strategy is Strategy.PREFIX:
            raise InvalidRequestError(
                "prefix_cache keeps its prefixes in the scheduler's radix cache over the state pool: "
                "serve the request (Serving.of(engine).generate) instead of preparing it alone",
                param="mode",
            )
        with self.lock:
            if p.spec.strategy is Strategy.FULL:
                out = self._full(p.segs, p.kinds, p.suffix)
            else:
                out = self._composed(p.segs, p.kinds, p.suffix, p.spec, p.w, tenant, into)
                out.segments = fold_pieces(out.segments, p.owners)
            self.headroom.top_up()  # the forward is queued: the GPU is busy while the host refills
            return out

    def seams_and_keys(self, p: PromptPieces, tenant: str) -> tuple[list[int], list[str | None]]:
        """A composed prompt's seam width per segment and its entry key (None: not cacheable); with
        ``seam="auto"`` the widths come from ``auto_seams`` (keys carry each segment's width)."""
        seams, keys, _ = self.seam_plan(p, tenant)
        return seams, keys

    def seam_plan(self, p: PromptPieces, tenant: str) -> tuple[list[int], list[str | None], BlendPlan | None]:
        """``seams_and_keys`` and, with ``seam="blend"``, the plan that picks the body tokens recomputed
        once the entries are there (``SeamPlanner.plan``)."""
        return self.seams.plan(p, tenant)

    def _full(self, segs: list[tuple[int, ...]], kinds: list[str], suffix: list[int]) -> Prepared:
        t0 = time.perf_counter()
        state = prefill(self.model, [[t for s in segs for t in s] + suffix], graphs=self.runner.graphs.stages)[0]
        return full_prepared(segs, kinds, state.length, state, {"prefill_ms": _ms(t0)})

    def _composed(
        self,
        segs: list[tuple[int, ...]],
        kinds: list[str],
        suffix: list[int],
        spec: Any,
        w: float | str,
        tenant: str,
        into: StateDestination | None = None,
    ) -> Prepared:
        t0 = time.perf_counter()
        seams, keys, bp = self.seam_plan(PromptPieces(segs, kinds, suffix, spec, w, 0), tenant)
        r = route(keys, self.cache)  # lookup
        t_lookup = _ms(t0)
        t1 = time.perf_counter()
        hits = [r.entries[i] is not None for i in range(len(segs))]
        cold = self.cold.batch(r, segs, seams) if bp is None else None  # blend: the scout reads the entries
        if cold is None:
            entries = self.cold.fill(self.cache, r, segs, kinds, seams, tenant)  # scatter prefill + store
        else:  # built inside the combine forward below, stored after it
            entries = with_built(r, cold.entries)
        entries = [e.to(self.device) if e is not None else None for e in entries]
        t_scatter = _ms(t1)
        t2 = time.perf_counter()
        blend = bp.pick(self.model, segs, entries, suffix) if bp is not None else None  # seam="blend"
        lay = plan_layout(segs, entries, seams, suffix, self.device, blend)
        graphs = self.runner.graphs
        state = combine(self.model, lay, entries, spec, cold=cold, kernels=self.kernels, into=into, graphs=graphs)
        if cold is not None:
            share = cold.n_tokens / (cold.n_tokens + lay.active_ids.numel())
            cold.set_cost(_ms(t2) * share)
            self.cold.store(self.cache, r, cold.entries, kinds, tenant)
        cached = sum(len(segs[i]) - seams[i] - (len(blend[i]) if blend else 0) for i in range(len(segs)) if hits[i])
        usage = [
            SegmentUsage(keys[i], kinds[i], len(segs[i]), hits[i], r.tiers[i] if hits[i] else None)
            for i in range(len(segs))
        ]
        return Prepared(
            state,
            spec.name,
            usage,
            state.length,
            cached,
            state.length - cached,
            timings_ms={
                "lookup_ms": t_lookup,
                "scatter_ms": t_scatter,
                "combine_ms": _ms(t2),
                **(cold.prep_ms if cold is not None else {}),
            },
        )

    def close(self) -> None:
        """Stop the scatter workers (if any); the scheduler is its ``Serving``'s to stop."""
        self.cold.close()

    def prewarm(
        self,
        segments: Sequence[Sequence[int]],
        kinds: Sequence[str],
        *,
        tenant: str = "default",
        mode: str | None = None,
        seam: float | str | None = None,
    ) -> list[SegmentUsage]:
        """Make sure every segment has an entry (PUT /v1/segments); returns their keys and hit flags
        (``seam="auto"``: the widths ``auto_seams`` gives these segments as one prompt)."""
        spec = mode_spec(mode or self.settings.default_mode)
        w = validate_seam(self.settings.default_seam if seam is None else seam)
        cut = split_for(segments, kinds, spec, self.settings.split_segment_tokens)
        if cut is not None:  # the pieces a request splits these segments into
            segments, kinds = cut.segs, cut.kinds
        pieces = PromptPieces([tuple(s) for s in segments], list(kinds), [], spec, w, 0)
        seams, keys = self.seams.every_key(pieces, tenant)
        with self.lock:
            r = route(keys, self.cache)
            self.cold.fill(self.cache, r, segments, kinds, seams, tenant)
            self.headroom.top_up()
        usage = [
            SegmentUsage(keys[i], kinds[i], len(segments[i]), r.entries[i] is not None, r.tiers[i])
            for i in range(len(segments))
        ]
        return fold_pieces(usage, cut.owners if cut is not None else ())
