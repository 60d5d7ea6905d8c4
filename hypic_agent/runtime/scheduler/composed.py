"""Composed (HYPIC) requests inside the scheduler: their work joins the step's one forward.

``ComposedPrep`` is what a composed request resolved once, at admission: its seam widths, entry keys
and blend plan (``SeamPlanner.plan``), and which segments were already cached when it arrived.

``StepWork`` gathers one step's HYPIC work across requests, within the step's token budget:

* a request whose cold segments fit (or that is alone in the step) *joins*: its cold segments go
  into the step's cold builds and its combine (``CombineWork``: seam windows, blend rows and the
  suffix over its entries) becomes rows of the same forward, writing its state straight into its
  slot and pages;
* a request whose cold segments do not fit has a share of them built in this step (cold rows only)
  and joins a later step.

Cold segments are deduplicated by entry key across the step's requests (two requests needing the
same document share one build), and built as one packed isolated batch per build context
(``ColdBatch``; a prompt's first segment is built without the context, ``context_at``), so all the
step's cold builds share one fused build. After the forward ``finish`` stores the new entries and
hands each joined request its logits and ``Prepared``.

With scatter workers (``Settings.scatter_workers > 1``) or fusing off (``Settings.fuse_cold_builds``)
a joining request's cold segments are built before the forward (``ColdBuilds.fill``: on the
workers, or in process); ``seam="blend"`` requests have theirs built first as well (the blend scout
reads the entries), then pick their body rows and join like the others.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from hypic_agent.runtime.engine import Engine
from hypic_agent.runtime.hypic.blend import BlendPlan
from hypic_agent.runtime.hypic.build import ColdBatch
from hypic_agent.runtime.hypic.build_context import context_at
from hypic_agent.runtime.hypic.combine_inputs import combine_inputs
from hypic_agent.runtime.hypic.combine_work import CombineWork
from hypic_agent.runtime.hypic.entry import SegmentEntry
from hypic_agent.runtime.hypic.layout import plan_layout
from hypic_agent.runtime.prompt_pieces import PromptPieces
from hypic_agent.runtime.results import Prepared, SegmentUsage, fold_pieces
from hypic_agent.runtime.router import Route, route
from hypic_agent.runtime.runner.destination import StateDestination
from hypic_agent.runtime.runner.pool import PoolSeq, StatePool


@dataclass
class ComposedPrep:
    """A composed request's plan, resolved once (``resolve``)."""

    pieces: PromptPieces
    tenant: str
    seams: list[int]
    keys: list[str | None]
    blend: BlendPlan | None
    hits: list[bool]  # cached when the request was admitted (what its usage reports as hits)
    tiers: list[str | None]
    lookup_ms: float = 0.0
    cold_build_ms: float = 0.0  # time of the steps that built a share of its cold segments

    @classmethod
    def resolve(cls, engine: Engine, p: PromptPieces, tenant: str) -> ComposedPrep:
        t0 = time.perf_counter()
        seams, keys, blend = engine.seam_plan(p, tenant)
        r = route(keys, engine.cache)
        hits = [e is not None for e in r.entries]
        return cls(p, tenant, seams, keys, blend, hits, r.tiers, (time.perf_counter() - t0) * 1e3)

    def lookup(self, engine: Engine) -> Route:
        """The entries as they are now (earlier steps may have built some). A re-read: the use was
        counted once, by ``resolve`` (what the usage reports as hits), so this counts nothing."""
        return route(self.keys, engine.cache, count=False)

    def n_active(self) -> int:
        """Rows its combine adds: the seams of cacheable segments (their entries exist once the step's
        cold builds ran), every token of the others, the suffix (blend rows aside)."""
        p = self.pieces
        n = len(p.suffix)
        for s, w, k in zip(p.segs, self.seams, self.keys, strict=True):
            n += len(s) if k is None else min(w, len(s))
        return n

    def prepared(self, total: int, blend: Sequence[Sequence[int]] | None, timings: dict[str, float]) -> Prepared:
        """Usage and timings of the finished prepare (its state is in the pool)."""
        p = self.pieces
        segs = p.segs
        cached = sum(
            len(segs[i]) - self.seams[i] - (len(blend[i]) if blend else 0) for i in range(len(segs)) if self.hits[i]
        )
        usage = [
            SegmentUsage(self.keys[i], p.kinds[i], len(segs[i]), self.hits[i], self.tiers[i] if self.hits[i] else None)
            for i in range(len(segs))
        ]
        return Prepared(
            None,
            p.spec.name,
            fold_pieces(usage, p.owners),
            total,
            cached,
            total - cached,
            timings_ms={"lookup_ms": self.lookup_ms, "cold_build_ms": self.cold_build_ms, **timings},
        )


@dataclass
class _Cold:
    key: str
    tokens: tuple[int, ...]
    seam: int
    kind: str
    tenant: str


@dataclass
class _Joined:
    owner: Any  # the live request (``work.LiveRequest``)
    prep: ComposedPrep
    seq: PoolSeq
    route: Route
    cold_keys: list[str | None]  # per segment: the step's cold key it reads (None: a hit or uncached)
    blend: list[list[int]] | None = None
    work: CombineWork | None = None


@dataclass
class StepWork:
    """One step's HYPIC work (module doc)."""

    engine: Engine
    pool: StatePool
    colds: dict[tuple[int, ...], dict[str, _Cold]] = field(default_factory=dict)  # build prefix -> key -> segment
    joined: list[_Joined] = field(default_factory=list)
    builders: list[Any] = field(default_factory=list)  # requests with a share of cold builds only
    batches: list[ColdBatch] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.joined and not self.cold_tokens

    @property
    def cold_tokens(self) -> int:
        return sum(len(prefix) + len(c.tokens) for prefix, group in self.colds.items() for c in group.values())

    def _prefix(self, i: int) -> tuple[int, ...]:
        return tuple(context_at(self.engine.build_context(), i).tokens)

    def _needed(self, prep: ComposedPrep, r: Route) -> list[int]:
        """Its cold segments that no request of this step builds yet."""
        return [i for i in r.cold if prep.keys[i] not in self.colds.get(self._prefix(i), {})]

    def _add_cold(self, prep: ComposedPrep, idx: Sequence[int]) -> None:
        p = prep.pieces
        for i in idx:
            key = prep.keys[i]
            assert key is not None
            self.colds.setdefault(self._prefix(i), {})[key] = _Cold(
                key, p.segs[i], prep.seams[i], p.kinds[i], prep.tenant
            )

    def offer(self, owner: Any, prep: ComposedPrep, seq: PoolSeq, budget: int, alone: bool) -> int:
        """Take ``owner``'s prepare work into this step as far as ``budget`` tokens allow; returns the
        tokens taken (0: nothing this step). ``alone``: nothing else runs in the step (no decode, no
        earlier work), so a request whose cold segments exceed the budget joins whole (up to
        ``kernels.max_fused_cold_tokens``)."""
        engine = self.engine
        r = prep.lookup(engine)
        in_process = engine.cold.pool is None and engine.settings.fuse_cold_builds
        if r.cold and (not in_process or prep.blend is not None):  # built before the forward, then join
            t0 = time.perf_counter()
            engine.cold.fill(engine.cache, r, prep.pieces.segs, prep.pieces.kinds, prep.seams, prep.tenant)
            prep.cold_build_ms += (time.perf_counter() - t0) * 1e3
            r = prep.lookup(engine)
        need = self._needed(prep, r)
        cold_tokens = sum(len(self._prefix(i)) + len(prep.pieces.segs[i]) for i in need)
        active = prep.n_active()
        cap = engine.kernels.max_fused_cold_tokens if alone else budget
        if cold_tokens + active <= budget or (alone and cold_tokens <= cap):
            self._add_cold(prep, need)
            cold_keys = [k if e is None else None for k, e in zip(prep.keys, r.entries, strict=True)]
            self.joined.append(_Joined(owner, prep, seq, r, cold_keys))
            return cold_tokens + active
        take: list[int] = []  # a share of its cold segments, in prompt order, within the budget
        used = 0
        for i in need:
            n = len(self._prefix(i)) + len(prep.pieces.segs[i])
            if take and used + n > min(budget, cap):
                break
            take.append(i)
            used += n
        self._add_cold(prep, take)
        self.builders.append(owner)
        return used

    def build(self) -> tuple[list[CombineWork], list[ColdBatch]]:
        """The step's cold batches and combines, for ``ModelRunner.plan`` (rows: colds, pool, combines)."""
        engine = self.engine
        built: dict[str, SegmentEntry] = {}
        for prefix, group in self.colds.items():
            if not group:
                continue
            cs = list(group.values())
            batch = ColdBatch(
                engine.model, [c.tokens for c in cs], [c.seam for c in cs], pair_dtype=engine.cold.pair_dtype,
                prefix=prefix, graphs=engine.runner.graphs.colds,
            )  # fmt: skip
            self.batches.append(batch)
            built.update({c.key: e for c, e in zip(cs, batch.entries, strict=True)})
        works: list[CombineWork] = []
        building = [e for b in self.batches for e in b.entries]
        model, kernels = engine.model, engine.kernels
        for j in self.joined:
            p, prep = j.prep.pieces, j.prep
            found = [e if k is None else built[k] for e, k in zip(j.route.entries, j.cold_keys, strict=True)]
            entries = [e.to(engine.device) if e is not None else None for e in found]
            if prep.blend is not None:
                j.blend = prep.blend.pick(engine.model, p.segs, entries, p.suffix)
            lay = plan_layout(p.segs, entries, prep.seams, p.suffix, engine.device, j.blend)
            inputs = partial(combine_inputs, model, lay, entries, p.spec.transition, None, building, kernels=kernels)
            j.work = CombineWork(lay, entries, p.spec, inputs, StateDestination.of(self.pool, j.seq, p.total))
            works.append(j.work)
        return works, self.batches

    def finish(self, logits: torch.Tensor, forward_ms: float) -> list[tuple[Any, torch.Tensor, Prepared]]:
        """After the forward (``logits``: one row per combine, in order): store the built entries (their
        cost: the forward's time by their share of its rows) and commit each joined request's state;
        returns (owner, first-token logits, prepared) per joined request."""
        engine = self.engine
        rows = sum(b.n_tokens for b in self.batches) + sum(j.work.n_rows for j in self.joined if j.work)
        for b, group in zip(self.batches, [g for g in self.colds.values() if g], strict=True):
            b.set_cost(forward_ms * b.n_tokens / max(rows, 1))
            for c, e in zip(group.values(), b.entries, strict=True):
                engine.cache.insert(c.key, e, kind=c.kind, tenant=c.tenant)
        out = []
        for j, row in zip(self.joined, logits, strict=True):
            assert j.work is not None and j.work.into is not None
            state = j.work.state(row)
            j.work.into.commit(state)
            timings = {"combine_ms": forward_ms, **({} if not self.batches else _prep_ms(self.batches))}
            out.append((j.owner, row, j.prep.prepared(state.length, j.blend, timings)))
        return out


def _prep_ms(batches: Sequence[ColdBatch]) -> dict[str, float]:
    out: dict[str, float] = {}
    for b in batches:
        for k, v in b.prep_ms.items():
            out[k] = out.get(k, 0.0) + v
    return out
