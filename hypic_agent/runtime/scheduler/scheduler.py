"""``Scheduler``: one engine thread runs ``step()`` in a loop (the manner of nano-vllm / mini-sglang).

Each step: take in submitted requests (a priority queue, FCFS among equals), drop cancelled ones
(their pool state is freed), admit waiting requests while a slot and the pages for prompt +
``max_tokens`` are free and fewer than ``max_running`` run, then run ONE forward of the model
runner that holds every decoding request's next token plus prefill chunks of preparing requests
(up to ``prefill_chunk_tokens``; a prompt alone in a step with nothing decoding runs up to
``prefill_idle_chunk_tokens`` as one forward, since nobody waits behind it), sample all rows on the
device, and stream the events. A composed
(HYPIC) request's combine is its own forward within the step; while others decode, its cold
segments are first built in batches of at most ``prefill_chunk_tokens`` tokens, one per step.

Overlap (``Settings.overlap_schedule``): a step of decode rows only is launched before the previous
one's tokens are read on the host (``inflight.InflightDecode``): its rows take their input ids from
the previous step's device-side sample, and the host reads, stop-checks and streams the previous
step while the device runs this one. A step with prefill, combine or constrained work reads the
step in flight first (its host work needs the tokens).

A request that could never fit the pool is refused at ``submit`` (4xx); a full waiting queue
answers ``QueueFullError`` (429 with Retry-After). Pages are reserved at admission for the whole
request, so a running request can never run out of memory: when the pool is full the next request
waits. Model work happens on the engine thread only, under the engine's lock.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import logging
import queue
import threading
import time
from collections.abc import Iterator

import torch

from hypic_agent.config import Settings
from hypic_agent.errors import ContextLengthError, QueueFullError
from hypic_agent.runtime.engine import Engine
from hypic_agent.runtime.hypic.modes import Strategy
from hypic_agent.runtime.output import OutputStream
from hypic_agent.runtime.prompt_pieces import PromptPieces
from hypic_agent.runtime.runner.plan import ForwardPlan, RowSnapshot
from hypic_agent.runtime.runner.pool import PoolSeq
from hypic_agent.runtime.runner.radix_cache import RadixCache, RadixHit
from hypic_agent.runtime.runner.runner import ModelRunner
from hypic_agent.runtime.runner.upload import upload
from hypic_agent.runtime.sampling import make_generator
from hypic_agent.runtime.scheduler.composed import ComposedPrep, StepWork
from hypic_agent.runtime.scheduler.inflight import InflightDecode
from hypic_agent.runtime.scheduler.request import EventSink, GenerationRequest, RequestHandle
from hypic_agent.runtime.scheduler.sampler import Picked, sample_on_device, sample_rows
from hypic_agent.runtime.scheduler.stats import SchedulerStats
from hypic_agent.runtime.scheduler.work import LiveRequest, prefix_keys

log = logging.getLogger("hypic.scheduler")
_Waiting = tuple[int, int, RequestHandle, PromptPieces]


class Scheduler:
    def __init__(self, engine: Engine, runner: ModelRunner, settings: Settings) -> None:
        self.engine = engine
        self.runner = runner
        self.pool = runner.pool
        self.radix = RadixCache(self.pool)  # prefix_cache mode: cached prefixes over the pool's pages
        self.max_running = min(settings.max_running, self.pool.n_slots)
        self.max_waiting = settings.max_waiting
        self.chunk = settings.prefill_chunk_tokens
        self.idle_chunk = max(settings.prefill_idle_chunk_tokens, self.chunk)  # a step nobody waits behind
        self.overlap = settings.overlap_schedule
        self._inflight: InflightDecode | None = None  # the overlapped decode step not read yet
        self.stats = SchedulerStats()
        self._inbox: queue.SimpleQueue[_Waiting] = queue.SimpleQueue()
        self._waiting: list[_Waiting] = []
        self._n_waiting = 0  # inbox + heap, for the queue limit (approximate across threads)
        self._order = itertools.count()
        self.live: list[LiveRequest] = []
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    # ------------------------------------------------------------------ caller side
    def submit(self, req: GenerationRequest, sink: EventSink | None = None) -> RequestHandle:
        """Validate and queue ``req``; returns its handle. Raises a 4xx error for a request that can
        never run and ``QueueFullError`` when the waiting queue is full. With ``sink`` the events go to
        it on the engine thread instead of ``handle.events()``. Cheap (no model work, no I/O): callable
        from an event loop."""
        sampling = req.sampling.validate()
        pieces = self.engine.pieces(req.plan, mode=req.mode, seam=req.seam, max_new_tokens=sampling.max_tokens)
        need = pieces.total + sampling.max_tokens
        if not self.pool.fits_ever(need):
            cap = self.pool.max_seq_pages * self.pool.page_size
            raise ContextLengthError(
                f"prompt ({pieces.total} tokens) + max_tokens ({sampling.max_tokens}) can never fit the state "
                f"pool ({cap} tokens, HYPIC_KV_POOL_TOKENS); send fewer segments or lower max_tokens",
                param="max_tokens",
            )
        if self._n_waiting >= self.max_waiting:
            raise QueueFullError(
                f"{self._n_waiting} requests are waiting (HYPIC_MAX_WAITING={self.max_waiting}); retry shortly",
                retry_after=1.0,
            )
        handle = RequestHandle(req, sink)
        self._n_waiting += 1
        self._inbox.put((req.priority, next(self._order), handle, pieces))
        self.start()
        self._wake.set()
        return handle

    def generate(self, req: GenerationRequest) -> Iterator:
        """Submit and iterate the events (closing the iterator cancels the request)."""
        yield from self.submit(req).events()

    def start(self) -> None:
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(target=self._loop, name="hypic-engine", daemon=True)
                self._thread.start()

    def shutdown(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()  # before the step: a submit during it is not lost
            try:
                busy = self.step()
            except Exception:  # a step never kills the engine thread (its requests were failed)
                log.exception("scheduler step failed")
                busy = False
                self._stop.wait(0.05)
            if not busy:
                self._wake.wait(0.05)

    # ------------------------------------------------------------------ engine side
    def step(self) -> bool:
        """One scheduling step; returns whether there was any work."""
        with self.engine.lock:
            self._take_inbox()
            self._reap_cancelled()
            self._admit()
            if not self.live:
                self._inflight = None  # its requests were all retired (cancelled): nothing to read
                return bool(self._waiting)
            try:
                self._run_step()
            except Exception as exc:  # never leave a consumer waiting on a step that keeps failing
                log.exception("scheduler step failed; failing its %d live requests", len(self.live))
                for r in list(self.live):
                    self._retire(r, error=exc)
            return True

    def _take_inbox(self) -> None:
        while True:
            try:
                heapq.heappush(self._waiting, self._inbox.get_nowait())
            except queue.Empty:
                return

    def _reap_cancelled(self) -> None:
        for r in [r for r in self.live if r.handle.cancelled]:
            self._retire(r, cancelled=True)
        if any(w[2].cancelled for w in self._waiting):
            gone = [w for w in self._waiting if w[2].cancelled]
            self._waiting = [w for w in self._waiting if not w[2].cancelled]
            heapq.heapify(self._waiting)
            for w in gone:
                self._n_waiting -= 1
                self.stats.cancelled += 1
                w[2].end()

    def _admit(self) -> None:
        while self._waiting and len(self.live) < self.max_running:
            _, _, handle, pieces = self._waiting[0]
            need = pieces.total + handle.request.sampling.max_tokens
            keys: list[str] | None = None
            hit: RadixHit | None = None
            try:
                if pieces.spec.strategy is Strategy.PREFIX:
                    keys = prefix_keys(self.engine, pieces, handle.request.tenant)
                    hit = self.radix.match(keys)  # locked: what makes room below never evicts it
                seq = self._reserve(need, hit)
            except Exception as exc:  # the head fails alone; it must not block the queue
                if hit is not None:
                    self.radix.unlock(hit.node)
                heapq.heappop(self._waiting)
                self._n_waiting -= 1
                self.stats.failed += 1
                handle.fail(exc)
                continue
            if seq is None:
                if hit is not None:
                    self.radix.unlock(hit.node)
                return  # the head waits for memory (FCFS: nobody overtakes it)
            heapq.heappop(self._waiting)
            self._n_waiting -= 1
            handle.admitted_at = time.perf_counter()
            s = handle.request.sampling
            r = LiveRequest(handle, pieces, OutputStream(self.engine.tokenizer, s, self.engine.eos_ids), None, seq)
            r.gen = make_generator(s, self.engine.device)
            if keys is not None:
                r.radix, r.prefix_keys, r.held = self.radix, keys, (hit.node if hit is not None else None)
            self.live.append(r)
            try:
                r.start(self.engine, self.pool, self.chunk, hit)
            except Exception as exc:
                self._retire(r, error=exc)

    def _reserve(self, need: int, hit: RadixHit | None) -> PoolSeq | None:
        """A slot and the pages for ``need`` tokens, the hit's full pages shared (None: not free).
        Pages short: the radix cache's least recently used unlocked prefixes are evicted first."""
        shared = hit.shared if hit is not None else ()
        seq = self.pool.alloc(need, shared)
        if seq is None and self.pool.free_slots:
            short = self.pool.pages_for(need) - len(shared) - self.pool.free_pages
            if short > 0 and self.radix.evict(short):
                seq = self.pool.alloc(need, shared)
        return seq

    def _run_step(self) -> None:
        """ONE forward: every decoding request's next token, prefill chunks and every composed
        request's combine (with the step's cold builds) within the token budget (``StepWork``).
        Decode rows only, with overlap on: launched before the step in flight is read."""
        if self._overlappable():
            self._overlapped_decode()
            return
        if self._inflight is not None:  # this step's host work needs every token read
            step, self._inflight = self._inflight, None
            self._read(step)
            if not self.live:
                return
        decoders = [r for r in self.live if r.decoding]
        budget = self.chunk
        rows: list[tuple[LiveRequest, tuple[int, ...]]] = [(r, (r.last_token,)) for r in decoders]  # type: ignore[misc]
        hypic = StepWork(self.engine, self.pool)
        snapshots: list[RowSnapshot] = []  # prefill rows passing a prefix-cache boundary
        for r in [r for r in self.live if r.preparing]:
            if budget <= 0:
                break
            try:
                if r.pieces.spec.composed:
                    if r.composed is None:
                        r.composed = ComposedPrep.resolve(self.engine, r.pieces, r.tenant)
                    assert r.seq is not None
                    alone = not rows and hypic.empty
                    budget -= hypic.offer(r, r.composed, r.seq, budget, alone)
                elif r.chunks and (len(r.chunks[0]) <= budget or len(rows) == len(decoders)):
                    # the step's only work so far and nothing decoding: its next chunks run as one forward
                    alone = not rows and hypic.empty
                    chunk, snap = r.pop_chunk(self.idle_chunk if alone else 0)
                    if snap is not None:
                        snapshots.append(dataclasses.replace(snap, row=len(rows)))
                    rows.append((r, chunk))
                    budget -= len(chunk)
            except Exception as exc:
                self._retire(r, error=exc)
        if not rows and hypic.empty:
            return
        t0 = time.perf_counter()
        involved: list[LiveRequest] = [r for r, _ in rows] + [j.owner for j in hypic.joined] + hypic.builders
        try:
            combines, colds = hypic.build()
            seqs = [r.seq for r, _ in rows]
            plan = self.runner.plan(seqs, [t for _, t in rows], combines, colds, snapshots)  # type: ignore[arg-type]
            logits = self.runner.forward(plan)
            if combines or colds:
                self.engine.headroom.top_up()  # the forward is queued: the GPU is busy while the host refills
            done = hypic.finish(logits[len(rows) :], (time.perf_counter() - t0) * 1e3)
        except Exception as exc:
            for r in dict.fromkeys(involved):  # once each
                self._retire(r, error=exc)
            return
        self._count(plan, len(decoders), len(hypic.joined) + len(hypic.builders))
        to_sample: list[tuple[LiveRequest, torch.Tensor]] = []
        for i, (r, _) in enumerate(rows):
            if r.decoding:
                to_sample.append((r, logits[i]))
            else:
                r.after_chunk(self.engine, self.pool)
                if not r.chunks:
                    to_sample.append((r, logits[i]))
        for owner, first, prepared in done:
            assert isinstance(owner, LiveRequest)
            owner.prepared = prepared
            to_sample.append((owner, first))
        if to_sample:
            self._sample_and_emit(to_sample)
        ms = (time.perf_counter() - t0) * 1e3
        if rows:
            self.stats.forward_ms += ms
        if hypic.joined:
            self.stats.combine_ms += ms
        elif not hypic.empty:
            self.stats.cold_build_ms += ms

    def _overlappable(self) -> bool:
        """The next step may be launched before the one in flight is read: overlap on, decode rows
        only (no request preparing: its chunk or combine is host work), no decoding constraint (its
        mask is computed on the host from the last token)."""
        if not self.overlap:
            return False
        decoding = False
        for r in self.live:
            if not r.decoding or r.out.constraint is not None:
                return False
            decoding = True
        return decoding

    def _overlapped_decode(self) -> None:
        """Launch a decode step (ids of pending rows from the step in flight, on the device), then
        read the step in flight and stream it while the device runs the new one."""
        prev, self._inflight = self._inflight, None
        go = [r for r in self.live if r.pending is None or len(r.out.ids) + 1 < r.out.sampling.max_tokens]
        t0 = time.perf_counter()
        step: InflightDecode | None = None
        if go:
            try:
                step = self._launch_decode(go, prev)
            except Exception as exc:
                if prev is not None:
                    self._read(prev)
                for r in go:
                    if not r.retired:
                        self._retire(r, error=exc)
                return
        if prev is not None:
            self._read(prev)
        if step is not None:
            for i, r in enumerate(step.lives):
                r.pending = i
            self._inflight = step
            self.stats.overlapped_steps += 1
            self.stats.forward_ms += (time.perf_counter() - t0) * 1e3

    def _launch_decode(self, go: list[LiveRequest], prev: InflightDecode | None) -> InflightDecode:
        """Queue one decode forward of ``go`` and its sampling on the device; reads nothing back."""
        seqs = [r.seq for r in go]
        plan = self.runner.plan(seqs, [(0 if r.pending is not None else r.last_token,) for r in go])  # type: ignore[arg-type, misc]
        fed = [i for i, r in enumerate(go) if r.pending is not None]
        if fed:  # their token is the step in flight's: copied on the device, never through the host
            assert prev is not None
            idx = upload(torch.tensor([fed, [go[i].pending for i in fed]], dtype=torch.int64), plan.ids.device)
            plan.ids.index_copy_(0, idx[0], prev.sampled.ids.index_select(0, idx[1]))
            for i in fed:
                go[i].fed_at = go[i].seq.length  # type: ignore[union-attr]
        logits = self.runner.forward(plan)
        self._count(plan, len(go))
        return InflightDecode(go, sample_on_device(logits[: len(go)].float(), [r.out for r in go], [r.gen for r in go]))

    def _read(self, step: InflightDecode) -> None:
        """Read a step in flight back, fill its placeholders and stream it (rows of retired requests dropped)."""
        picked = step.sampled.read()
        rows: list[tuple[LiveRequest, Picked]] = []
        for r, p in zip(step.lives, picked, strict=True):
            r.pending = None
            if r.retired:
                continue
            if r.fed_at is not None and r.seq is not None:
                r.seq.tokens[r.fed_at] = p[0]
                r.fed_at = None
            rows.append((r, p))
        self._emit(rows)

    def _count(self, plan: ForwardPlan, n_decode: int, prep_items: int = 0) -> None:
        s = self.stats
        s.forwards += 1
        s.decode_tokens += n_decode
        s.prefill_tokens += plan.n_tokens - n_decode
        s.combine_steps += prep_items
        s.cold_built_tokens += sum(b.n_tokens for b in plan.colds)

    def _sample_and_emit(self, rows: list[tuple[LiveRequest, torch.Tensor]]) -> None:
        lives = [r for r, _ in rows]
        picked = sample_rows(torch.stack([x for _, x in rows]).float(), [r.out for r in lives], [r.gen for r in lives])
        self._emit(list(zip(lives, picked, strict=True)))

    def _emit(self, rows: list[tuple[LiveRequest, Picked]]) -> None:
        """Push each request's sampled token into its stream, stream the events, retire the finished."""
        now = time.perf_counter()
        for r, (tok, lp, top) in rows:
            if r.last_token is None:
                r.ttft_ms = (now - r.handle.request.t0) * 1e3
            for ev in r.out.push(tok, lp, top):
                r.handle.put(ev)
            r.last_token = tok
            if r.out.done:
                self._retire(r)

    def _retire(self, r: LiveRequest, *, cancelled: bool = False, error: BaseException | None = None) -> None:
        """Free ``r``'s pool state and end its stream (finish event, error, or nothing if cancelled)."""
        r.retired = True
        if r in self.live:
            self.live.remove(r)
        if r.seq is not None:
            self.pool.free(r.seq)
            r.seq = None
        if r.radix is not None:
            if r.held is not None:
                r.radix.unlock(r.held)  # its cached prefix may be evicted now
                r.held = None
            if r.snapshot is not None:  # reserved for a forward that failed
                r.radix.release_snapshot(r.snapshot)
                r.snapshot = None
        if error is not None:
            self.stats.failed += 1
            r.handle.fail(error)
            return
        if cancelled:
            self.stats.cancelled += 1
            r.handle.end()
            return
        try:
            assert r.prepared is not None
            total = (time.perf_counter() - r.handle.request.t0) * 1e3
            events = r.out.finish(r.prepared, r.ttft_ms, total)
        except Exception as exc:
            self.stats.failed += 1
            r.handle.fail(exc)
            return
        for ev in events:
            r.handle.put(ev)
        r.handle.end()
        self.stats.finished += 1

    # ------------------------------------------------------------------ introspection
    def snapshot(self) -> dict[str, int]:
        u = self.pool.usage()
        rs = self.radix.stats()
        return {
            "waiting": self._n_waiting,
            "running": sum(1 for r in self.live if r.decoding),
            "preparing": sum(1 for r in self.live if not r.decoding),
            "slots_used": u.slots_used,
            "slots_total": u.slots_total,
            "pages_used": u.pages_used,
            "pages_total": u.pages_total,
            "prefix_nodes": rs.nodes,
            "prefix_pages": rs.pages,
            "prefix_snapshots": rs.snapshots,
        }
