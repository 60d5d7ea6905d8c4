"""``WorkerPool``: rank 0's side of the scatter workers: start, route to, supervise, stop.

The pool starts one ``torch.multiprocessing`` (spawn) process per worker, each on its device with a
replica of rank 0's model, and rendezvous with each over a ``TCPStore`` it hosts (``channel``).
``build`` splits cold segments over the live workers (``router``: LPT on the fitted cost model,
aware of work already queued per worker, or round-robin), sends each worker its share as packed
batches (one job per batch) from one thread per worker, and receives every entry's tensors straight
into rank 0's device, ``stream_layers`` layers at a time as the worker builds them (``receive``).
A worker that dies or does not answer within ``timeout_s`` is killed; the segments it had not
returned whole are rebuilt locally (``local_build``, rank 0's model), so the call still returns
every entry, complete; the worker is restarted in the background, and ``stats.failures`` /
``stats.restarts`` count it. A worker process that died while idle (``kill -9`` between requests)
is noticed before any job is sent to it: by a supervisor thread every ``supervise_s`` and at the
start of every ``build``, whose segments then go to the live workers only. A restart that fails
(the new process dies while it loads) is tried again, ``restart_backoff_s`` later and doubling up
to a minute, until it succeeds or the pool closes (``stats.restart_failures``). ``close`` drains
in-flight builds, stops the workers, then kills any that did not exit, and joins them all: no
process outlives the pool.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hypic_agent.runtime.hypic.entry import SegmentEntry
from hypic_agent.runtime.router import CostModel, lpt_assign, round_robin_assign
from hypic_agent.runtime.scatter import _batches
from hypic_agent.runtime.workers import protocol as wire
from hypic_agent.runtime.workers.channel import Channel
from hypic_agent.runtime.workers.handle import Launch, WorkerHandle
from hypic_agent.runtime.workers.receive import run_job

log = logging.getLogger("hypic.workers")

# (segments, seams, pair dtype, build-context tokens) -> entries, built on rank 0
LocalBuild = Callable[[list[tuple[int, ...]], list[int], torch.dtype, tuple[int, ...]], list[SegmentEntry]]


class WorkerStartError(RuntimeError):
    """A worker could not start (its device, its model, the rendezvous): raised at start-up."""


@dataclass
class PoolStats:
    jobs: int = 0
    entries: int = 0
    failures: int = 0  # workers that died or timed out during a build
    restarts: int = 0  # workers brought back after a failure
    restart_failures: int = 0  # restarts that failed (tried again after a backoff)
    rebuilt_locally: int = 0  # segments rank 0 built because their worker failed
    groups: int = 0  # (entry, layer group) messages received whole
    transfer_ms: list[float] = field(default_factory=list)  # per entry: its groups' header to last byte, summed
    # per job: rank 0's wall time not covered by the worker's build (job out, transfer left after
    # the last layer, assembly): what streaming layer groups hides
    exposed_ms: list[float] = field(default_factory=list)


class WorkerPool:
    def __init__(
        self,
        settings_json: str,
        devices: Sequence[str],
        *,
        model: str | None,
        fingerprint: str,
        layer_kinds: Sequence[str],
        home: torch.device,
        local_build: LocalBuild,
        policy: str = "lpt",
        timeout_s: float = 60.0,
        max_batch_tokens: int = 65536,
        cost: CostModel | None = None,
        stream_layers: int = 0,
        delay_s: float = 0.0,
        group_delay_s: float = 0.0,
        start_timeout_s: float = 600.0,
        supervise_s: float = 1.0,
        restart_backoff_s: float = 1.0,
    ) -> None:
        """``stream_layers``: layers per message as a worker streams its entries back (0: whole
        entries after the build); ``delay_s`` / ``group_delay_s``: fault injection (``WorkerSpec``);
        ``supervise_s``: how often a thread looks for worker processes that died while idle (0: only
        at each ``build``); ``restart_backoff_s``: the first wait before a failed restart is tried again."""
        if not devices:
            raise ValueError("a worker pool needs at least one device")
        if policy not in ("lpt", "round_robin"):
            raise ValueError(f"unknown scatter policy {policy!r}: lpt | round_robin")
        self.layer_kinds = tuple(layer_kinds)
        self.home = home
        self.local_build = local_build
        self.policy = policy
        self.timeout_s = timeout_s
        self.max_batch_tokens = max_batch_tokens
        self.cost = cost or CostModel()
        self.stream_layers = stream_layers
        self.delay_s = delay_s
        self.restart_backoff_s = restart_backoff_s
        self.stats = PoolStats()
        self.workers = [WorkerHandle(i, d) for i, d in enumerate(devices)]
        self.queued_ms = [0.0] * len(self.workers)
        self._queue_lock = threading.Lock()
        store = dist.TCPStore(
            "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout_s)
        )
        launch = Launch(  # what every (re)start uses: it waits start_timeout_s for the model load
            mp.get_context("spawn"),
            store,
            settings_json,
            model,
            fingerprint,
            home,
            timeout_s,
            start_timeout_s,
            delay_s,
            group_delay_s,
        )
        self._launch: Launch | None = launch  # None once closed (the store let go)
        self._stop = launch.stop  # set by close: restarts and the supervisor give up
        self._exec = ThreadPoolExecutor(max_workers=len(self.workers), thread_name_prefix="scatter")
        self._restarting: list[threading.Thread] = []
        self._supervisor: threading.Thread | None = None
        self._closed = False
        try:
            errors = list(self._exec.map(lambda w: w.start(launch), self.workers))
            bad = [e for e in errors if e is not None]
            if bad:
                raise WorkerStartError("scatter workers failed to start: " + "; ".join(bad))
        except BaseException:
            self.close(drain=False)
            raise
        if supervise_s > 0:
            self._supervisor = threading.Thread(
                target=self._supervise, args=(supervise_s,), daemon=True, name="scatter-supervisor"
            )
            self._supervisor.start()

    # ------------------------------------------------------------------ failure / restart
    def _fail(self, w: WorkerHandle, why: BaseException | str) -> None:
        """``w`` died or timed out (its lock held): kill it and restart it in the background."""
        log.warning("scatter worker %d failed (%s); it is restarted, rank 0 builds what it had", w.index, why)
        with self._queue_lock:
            self.stats.failures += 1
        w.kill()
        if not self._closed:
            t = threading.Thread(target=self._restart, args=(w,), daemon=True, name=f"scatter-restart-{w.index}")
            self._restarting = [r for r in self._restarting if r.is_alive()] + [t]
            t.start()

    def _restart(self, w: WorkerHandle) -> None:
        """Start ``w`` again; a failed start is tried again after a backoff (doubling, at most 60 s)
        until one succeeds or the pool closes: a worker is never given up for good."""
        wait = self.restart_backoff_s
        while True:
            with w.lock:
                if self._closed or self._launch is None:
                    return
                err = w.start(self._launch)
                if err is None:
                    with self._queue_lock:
                        self.stats.restarts += 1
                    return
            with self._queue_lock:
                self.stats.restart_failures += 1
            if self._closed:
                return
            log.error("scatter worker %d could not be restarted (%s); trying again in %.0f s", w.index, err, wait)
            if self._stop.wait(wait):
                return
            wait = min(2 * wait, 60.0)

    def reap(self) -> list[int]:
        """Fail (and restart) every worker marked ready whose process has exited (killed while idle);
        the indices failed. A worker busy with a job is left to its job, which notices by itself."""
        failed = []
        for w in self.workers:
            if not w.alive or w.exited() is None or not w.lock.acquire(blocking=False):
                continue
            try:
                how = w.exited()
                if w.alive and how is not None:  # still so, now that its lock is held
                    self._fail(w, f"its process {w.proc.pid} ended: {how}")
                    failed.append(w.index)
            finally:
                w.lock.release()
        return failed

    def _supervise(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            try:
                self.reap()
            except Exception:  # never let the supervisor die: the next build reaps as well
                log.exception("scatter supervisor")

    # ------------------------------------------------------------------ building
    def alive(self) -> list[int]:
        """Workers ready for jobs: started, and their process still running."""
        return [w.index for w in self.workers if w.alive and w.exited() is None]

    def pids(self) -> list[int]:
        return [w.proc.pid for w in self.workers if w.proc is not None and w.proc.is_alive()]

    def assign(self, lengths: Sequence[int], workers: Sequence[int]) -> list[list[int]]:
        """Segment indices per worker of ``workers`` (policy, cost model, queued work)."""
        if self.policy == "round_robin":
            return round_robin_assign(len(lengths), len(workers))
        with self._queue_lock:
            loads = [self.queued_ms[w] for w in workers]
        return lpt_assign([self.cost.predict(n) for n in lengths], len(workers), loads)

    def build(
        self,
        segments: Sequence[Sequence[int]],
        seams: Sequence[int],
        pair_dtype: torch.dtype = torch.float32,
        prefix: Sequence[int] = (),
    ) -> list[SegmentEntry]:
        """Entries for ``segments`` (input order) built on the workers, each on rank 0's device, every
        segment prefilled after ``prefix`` (the build context's tokens; empty: isolated builds)."""
        if self._closed:
            raise RuntimeError("the worker pool is closed")
        self.reap()  # a worker killed since the last build gets no job: its share goes to the others
        segs = [tuple(int(t) for t in s) for s in segments]
        ctx = tuple(int(t) for t in prefix)
        out: list[SegmentEntry | None] = [None] * len(segs)
        live = self.alive()
        if live and segs:
            groups = self.assign([len(s) for s in segs], live)
            futures = [
                self._exec.submit(self._run, self.workers[w], g, segs, seams, pair_dtype, ctx, out)
                for w, g in zip(live, groups, strict=True)
                if g
            ]
            for f in futures:
                f.result()
        missing = [i for i, e in enumerate(out) if e is None]
        if missing:  # no live worker, or a worker failed: rank 0 builds what is left
            self.stats.rebuilt_locally += len(missing) if live else 0
            built = self.local_build([segs[i] for i in missing], [seams[i] for i in missing], pair_dtype, ctx)
            for i, e in zip(missing, built, strict=True):
                out[i] = e
        return [e for e in out if e is not None]

    def _run(
        self,
        w: WorkerHandle,
        group: list[int],
        segs: list[tuple[int, ...]],
        seams: Sequence[int],
        pair_dtype: torch.dtype,
        prefix: tuple[int, ...],
        out: list[SegmentEntry | None],
    ) -> None:
        """Send ``w`` its segments as jobs of at most ``max_batch_tokens`` and collect the entries; on
        a failure the rest stays None (rebuilt by the caller) and the worker is replaced."""
        predicted = {i: self.cost.predict(len(segs[i])) for i in group}
        remaining = sum(predicted.values())
        with self._queue_lock:
            self.queued_ms[w.index] += remaining
        try:
            with w.lock:
                for batch in _batches(group, [len(s) for s in segs], self.max_batch_tokens):
                    if not w.alive or w.chan is None:
                        return
                    try:
                        self._job(w.chan, batch, segs, seams, pair_dtype, prefix, out)
                    except Exception as e:  # the worker died or timed out
                        self._fail(w, e)
                        return
                    done = sum(predicted[i] for i in batch)
                    remaining -= done
                    with self._queue_lock:
                        self.queued_ms[w.index] -= done
        finally:
            with self._queue_lock:  # what a failed worker did not build is no longer queued on it
                self.queued_ms[w.index] -= remaining

    def _job(
        self,
        chan: Channel,
        batch: list[int],
        segs: list[tuple[int, ...]],
        seams: Sequence[int],
        pair_dtype: torch.dtype,
        prefix: tuple[int, ...],
        out: list[SegmentEntry | None],
    ) -> None:
        with self._queue_lock:  # worker threads send jobs at once
            self.stats.jobs += 1
            job_id = self.stats.jobs
        picked = [segs[i] for i in batch]
        job = wire.Job(job_id, picked, [int(seams[i]) for i in batch], pair_dtype, self.stream_layers, prefix)
        got = run_job(chan, job, self.layer_kinds, self.home, self._count_group)
        # only complete jobs are published: a worker that dies mid-job leaves nothing half-received
        for i, e in zip(batch, got.entries, strict=True):
            out[i] = e
        with self._queue_lock:
            self.stats.entries += len(got.entries)
            self.stats.transfer_ms += got.transfer_ms
            self.stats.exposed_ms.append(got.wall_ms - got.build_ms - self.delay_s * 1e3)
        self.cost.observe([len(s) for s in job.segments], got.build_ms)

    def _count_group(self) -> None:
        with self._queue_lock:
            self.stats.groups += 1

    # ------------------------------------------------------------------ shutdown
    def close(self, drain: bool = True) -> None:
        """Drain in-flight builds, stop every worker (``STOP``, then kill what has not exited), join."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()  # restarts waiting for a model load or a backoff give up, the supervisor ends
        self._exec.shutdown(wait=drain)
        if self._supervisor is not None:
            self._supervisor.join(timeout=self.timeout_s)
        for t in self._restarting:
            t.join(timeout=self.timeout_s)
        for w in self.workers:
            with w.lock:
                if w.alive and w.chan is not None:
                    with contextlib.suppress(Exception):  # already gone: killed below
                        w.chan.send(wire.header(wire.STOP, 0, 0, 0, 0))
        for w in self.workers:
            if w.proc is not None:
                w.proc.join(timeout=5)
            w.kill()
        self._launch = None

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
