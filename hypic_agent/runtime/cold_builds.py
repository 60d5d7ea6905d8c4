"""``ColdBuilds``: how an engine turns the cold segments of a request into stored entries.

Three ways, chosen per request by the engine:

* fused: a ``ColdBatch`` the combine forward builds inside itself (``batch``; the engine stores the
  entries after the forward with ``store``);
* in process: ``scatter_prefill`` over the model, before the combine (``fill``);
* on scatter workers: a ``WorkerPool`` of processes (``Settings.scatter_workers > 1``), started here
  at construction (``fill`` sends the cold segments there).

Every path prefills after the build context (``Settings.build_prefix``) the engine resolves, and
stores under the route's keys; except a prompt's first segment, which nothing precedes: it is
built in isolation (its exact rows; ``SeamPlanner.entry_key`` keys it without the context), on the
in-process or worker path (a fused batch has one context for all its segments).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from hypic_agent.config import Settings
from hypic_agent.kernels.config import KernelConfig
from hypic_agent.runtime.hypic.build import ColdBatch, build_entries
from hypic_agent.runtime.hypic.build_context import BuildContext, context_at
from hypic_agent.runtime.hypic.cache import EntryCache
from hypic_agent.runtime.hypic.entry import SegmentEntry
from hypic_agent.runtime.models.hybrid import HybridForCausalLM
from hypic_agent.runtime.router import Route
from hypic_agent.runtime.runner.graph_set import GraphSet
from hypic_agent.runtime.scatter import scatter_prefill
from hypic_agent.runtime.workers.devices import worker_devices
from hypic_agent.runtime.workers.pool import WorkerPool


class ColdBuilds:
    def __init__(
        self,
        model: HybridForCausalLM,
        settings: Settings,
        kernels: KernelConfig,
        build_context: Callable[[], BuildContext],
        *,
        fingerprint: str,
        model_spec: str | None = None,
        graphs: GraphSet | None = None,
    ) -> None:
        """Starts the scatter workers when ``settings.scatter_workers > 1`` (raises ``DeviceError`` /
        ``WorkerStartError`` at once on bad input)."""
        self.model = model
        self.settings = settings
        self.kernels = kernels
        self.build_context = build_context
        self.graphs = graphs  # the engine's runner's (cold cores, token-local stages)
        self.pair_dtype = getattr(torch, settings.pair_dtype)
        self.device = next(model.parameters()).device
        self.pool: WorkerPool | None = None
        if settings.scatter_workers > 1:
            self.pool = self._start_pool(fingerprint, model_spec)

    def _start_pool(self, fingerprint: str, model_spec: str | None) -> WorkerPool:
        s = self.settings
        devices = worker_devices(s.scatter_workers, s.scatter_devices, self.device)

        def local(
            segs: list[tuple[int, ...]], seams: list[int], dt: torch.dtype, prefix: tuple[int, ...]
        ) -> list[SegmentEntry]:
            return build_entries(self.model, segs, seams, pair_dtype=dt, prefix=prefix, graphs=self.graphs)

        return WorkerPool(
            s.model_dump_json(),
            devices,
            model=model_spec,
            fingerprint=fingerprint,
            layer_kinds=self.model.config.layer_types,
            home=self.device,
            local_build=local,
            policy=s.scatter_policy,
            timeout_s=s.scatter_timeout_s,
            stream_layers=s.scatter_stream_layers,
        )

    def batch(self, r: Route, segs: Sequence[Sequence[int]], seams: Sequence[int]) -> ColdBatch | None:
        """The request's cold segments as a batch for the combine forward, or None (nothing cold,
        fusing off, several scatter workers, or more cold tokens than ``kernels.max_fused_cold_tokens``)."""
        if not r.cold or not self.settings.fuse_cold_builds or self.settings.scatter_workers != 1:
            return None
        ctx = self.build_context()
        if context_at(ctx, r.cold[0]) != ctx:  # the first segment builds without the context: not one batch
            return None
        if sum(len(segs[i]) for i in r.cold) > self.kernels.max_fused_cold_tokens:
            return None
        cold_segs, cold_seams = [segs[i] for i in r.cold], [seams[i] for i in r.cold]
        colds = self.graphs.colds if self.graphs is not None else None
        return ColdBatch(self.model, cold_segs, cold_seams, pair_dtype=self.pair_dtype, prefix=ctx.tokens, graphs=colds)

    def fill(
        self,
        cache: EntryCache,
        r: Route,
        segs: Sequence[Sequence[int]],
        kinds: Sequence[str],
        seams: Sequence[int],
        tenant: str,
    ) -> list[SegmentEntry | None]:
        """Prefill the routed cold segments into entries, store them in ``cache`` (the engine's: the
        server swaps in its tiered store), and return every segment's entry (hits and freshly built;
        None where the segment is not cached)."""
        ctx = self.build_context()
        alone = [i for i in r.cold if context_at(ctx, i) != ctx]  # the first segment (module doc)
        rest = [i for i in r.cold if i not in alone]  # r.cold ascends, so alone + rest keeps its order
        built = self._build(alone, segs, seams, ()) + self._build(rest, segs, seams, ctx.tokens)
        self.store(cache, r, built, kinds, tenant)
        return with_built(r, built)

    def _build(
        self, idx: Sequence[int], segs: Sequence[Sequence[int]], seams: Sequence[int], prefix: Sequence[int]
    ) -> list[SegmentEntry]:
        """Entries of segments ``idx`` prefilled after ``prefix`` (on the workers where there are some)."""
        if not idx:
            return []
        cold_segs, cold_seams = [segs[i] for i in idx], [seams[i] for i in idx]
        if self.pool is not None:  # the job carries the context: workers build after the same tokens
            return self.pool.build(cold_segs, cold_seams, self.pair_dtype, prefix)
        return scatter_prefill(
            [self.model], cold_segs, cold_seams, pair_dtype=self.pair_dtype, prefix=prefix, graphs=self.graphs
        )

    def store(
        self, cache: EntryCache, r: Route, built: Sequence[SegmentEntry], kinds: Sequence[str], tenant: str
    ) -> None:
        """Insert the entries built for ``r.cold`` (in that order) into ``cache``."""
        for i, e in zip(r.cold, built, strict=True):
            key = r.keys[i]
            assert key is not None
            cache.insert(key, e, kind=kinds[i], tenant=tenant)

    def close(self) -> None:
        """Stop the scatter workers (if any)."""
        if self.pool is not None:
            self.pool.close()


def with_built(r: Route, built: Sequence[SegmentEntry]) -> list[SegmentEntry | None]:
    """Every segment's entry: its hit, or the one built for its key (``built`` follows ``r.cold``; a
    repeated cold document gets the entry of its first occurrence), or None when not cached."""
    by_key = {r.keys[i]: e for i, e in zip(r.cold, built, strict=True)}
    return [e if e is not None else by_key.get(r.keys[i]) for i, e in enumerate(r.entries)]
