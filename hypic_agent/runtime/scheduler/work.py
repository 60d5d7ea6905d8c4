"""``LiveRequest``: one admitted request inside the scheduler, from its prepare work to its last token.

Prepare work by mode:

* ``full_recompute``: the whole prompt as chunks of the runner's extend forward;
* ``prefix_cache``: the longest cached prefix (``runner.radix_cache``) begins the request's block
  table (its pages shared, the partial last one copied) and its snapshot is the slot's linear
  state; the rest runs as chunks, and where one passes the end of the request's segments its
  linear mixers write the state there into a reserved snapshot row (``plan.RowSnapshot``: the
  boundary costs no forward of its own), so the boundary is recorded in the cache (the pages
  shared, the linear state snapshotted); with no row to be had the chunk stops at the boundary;
* composed modes (``hypic`` and its ablations): seams, keys and blend plan resolved once at
  admission (``composed.ComposedPrep``); each step its combine joins the step's one forward with
  every other request's work (``composed.StepWork``), its cold segments built in the same forward
  (or a share of them per step when they exceed the budget), writing its state straight into its
  slot and pages (``runner.destination``: no ``pool.load``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from hypic_agent.runtime.engine import Engine
from hypic_agent.runtime.hypic.modes import Strategy
from hypic_agent.runtime.output import OutputStream
from hypic_agent.runtime.prompt_pieces import PromptPieces
from hypic_agent.runtime.results import Prepared, full_prepared, prefix_prepared
from hypic_agent.runtime.runner.plan import RowSnapshot
from hypic_agent.runtime.runner.pool import PoolSeq, StatePool
from hypic_agent.runtime.runner.radix_cache import RadixCache, RadixHit, RadixNode
from hypic_agent.runtime.scheduler.composed import ComposedPrep
from hypic_agent.runtime.scheduler.request import RequestHandle


def split_chunks(tokens: Sequence[int], size: int) -> list[tuple[int, ...]]:
    return [tuple(tokens[i : i + size]) for i in range(0, len(tokens), size)]


def prefix_keys(engine: Engine, pieces: PromptPieces, tenant: str) -> list[str]:
    """A ``prefix_cache`` prompt's segment keys: the radix cache's path."""
    return [engine.entry_key(s, tenant, 0) for s in pieces.segs]


@dataclass(eq=False)  # one request is itself only: compared and hashed by identity
class LiveRequest:
    handle: RequestHandle
    pieces: PromptPieces
    out: OutputStream
    gen: torch.Generator | None
    seq: PoolSeq | None = None
    chunks: deque[tuple[int, ...]] = field(default_factory=deque)  # prefill chunks still to run
    prepared: Prepared | None = None
    last_token: int | None = None  # to feed in the next decode step
    boundary: int = 0  # prefix_cache: sequence length whose state goes into the prefix cache
    prefix_keys: list[str] = field(default_factory=list)
    radix: RadixCache | None = None  # prefix_cache: the scheduler's cache
    held: RadixNode | None = None  # prefix_cache: the node locked for this request (unlocked at retire)
    snapshot: int | None = None  # prefix_cache: the reserved row the running chunk fills at the boundary
    ttft_ms: float = 0.0
    cost_ms: dict[str, float] = field(default_factory=dict)
    # overlapped decode (``scheduler.Scheduler``): the row of this request's last sampled token in the
    # step still in flight (not read on the host yet), and where in ``seq.tokens`` the next step fed
    # it (a placeholder until it is read)
    pending: int | None = None
    fed_at: int | None = None
    retired: bool = False
    # composed modes: seams, keys and blend plan resolved once, at admission (``composed.ComposedPrep``)
    composed: ComposedPrep | None = None

    @property
    def tenant(self) -> str:
        return self.handle.request.tenant

    @property
    def decoding(self) -> bool:
        return self.last_token is not None or self.pending is not None

    @property
    def preparing(self) -> bool:
        return self.last_token is None and self.pending is None

    # ------------------------------------------------------------------ prepare plans
    def start(self, engine: Engine, pool: StatePool, chunk: int, hit: RadixHit | None = None) -> None:
        """Right after admission (``seq`` allocated): resume at what is cached, queue the chunks.
        ``prefix_cache``: ``prefix_keys`` and ``radix`` are set; ``hit`` (locked, ``held``) is the
        match whose full pages begin ``seq``'s block table."""
        p = self.pieces
        assert self.seq is not None
        if p.spec.strategy is Strategy.FULL:
            self.prepared = full_prepared(p.segs, p.kinds, p.total)
            self.chunks.extend(split_chunks([t for s in p.segs for t in s] + p.suffix, chunk))
        elif p.spec.strategy is Strategy.PREFIX:
            t0 = time.perf_counter()
            keys = self.prefix_keys or prefix_keys(engine, p, self.tenant)
            self.prefix_keys, depth = keys, 0
            if hit is not None and self.radix is not None:
                self.radix.restore(hit, self.seq)
                self.seq.tokens = [t for s in p.segs[: hit.depth] for t in s]
                depth = hit.depth
            reused = self.seq.length
            missed = [t for s in p.segs[depth:] for t in s]
            if depth < len(p.segs) and self.radix is not None:
                self.boundary = reused + len(missed)
            self.chunks.extend(split_chunks(missed + p.suffix, chunk))
            lookup_ms = {"prefix_lookup_ms": (time.perf_counter() - t0) * 1e3}
            self.prepared = prefix_prepared(keys, p.segs, p.kinds, depth, reused, p.total, None, lookup_ms)

    def pop_chunk(self, merge_up_to: int = 0) -> tuple[tuple[int, ...], RowSnapshot | None]:
        """The next prefill chunk (joined with the chunks after it while it stays within
        ``merge_up_to`` tokens: a step nobody waits behind), and where it passes the prefix-cache
        boundary the split that snapshots the state there (``row`` 0: the scheduler sets the chunk's
        row in its plan)."""
        chunk = self.chunks.popleft()
        while self.chunks and len(chunk) + len(self.chunks[0]) <= merge_up_to:
            chunk += self.chunks.popleft()
        if not self.boundary or self.radix is None or self.seq is None:
            return chunk, None
        off = self.boundary - self.seq.length
        if not 0 < off < len(chunk):
            return chunk, None
        snap = self.radix.reserve_snapshot()
        if snap is None:  # no row free: stop at the boundary, the slot's state is snapshotted after it
            self.chunks.appendleft(chunk[off:])
            return chunk[:off], None
        self.snapshot = snap
        return chunk, RowSnapshot(0, off, snap)

    def after_chunk(self, engine: Engine, pool: StatePool) -> None:
        """After a chunk ran: a prefix-cache request that reached or passed its boundary records it
        (its pages shared into the radix cache, its linear state snapshotted; the end node stays
        locked)."""
        assert self.seq is not None
        if not self.boundary or self.radix is None:
            return
        snap, self.snapshot = self.snapshot, None
        if snap is None and self.seq.length != self.boundary:
            return
        node = self.radix.insert(self.prefix_keys, [len(s) for s in self.pieces.segs], self.seq, snapshot=snap)
        if node is not None:
            if self.held is not None:
                self.radix.unlock(self.held)
            self.held = node
        self.boundary = 0
