"""Warm start: run real work through a served engine before it listens, so that no request pays a
Triton compile, an autotune or a CUDA-graph capture (``hypic-agent serve``, ``Settings.warm_start``).

On CUDA the first forward of each new shape compiles the Triton kernels it reaches (and autotunes
those with several launch shapes), and the runner captures its CUDA graphs on first use: a decode
graph per batch bucket (``runner.decode_graphs``), the token-local stages per token bucket
(``runner.stage_graphs``). Measured on the H200 before this existed: TTFT 9.8 s for the first
200-token prompt, 28-31 s for the first 64 concurrent 2k prompts. ``warm_up`` pays all of that at
start-up, in three stages reported through ``progress`` (a ``startup.StartupLog``):

1. decode buckets: for every bucket of ``decode_buckets`` (up to ``decode_graph_max_batch``, capped
   by the pool's slots) ONE decode-only forward of exactly that many rows through the runner, over
   pool sequences allocated for it and freed again: each bucket's decode graph is captured now;
2. prefill: full_recompute prompts of each size of ``prefill_sizes`` (on CUDA every token bucket of
   the layer graphs, each also less 3 tokens: Triton compiles another variant for an integer
   argument that is not a multiple of 16, and ``prefill_chunk_tokens``; on CPU, where nothing
   compiles, 64 tokens), then a ``prefix_cache`` pair (the second request resumes the first's
   cached prefix: the radix cache's restore and snapshot paths), through the scheduler;
3. composed: per composed mode (``hypic``, and the default mode when it is another composed one) a
   request over ``warm_start_segments`` with every segment cold (cold builds fused into the combine
   forward, or on the scatter workers), then the same segments with another question (a warm
   combine), through the scheduler.

Nothing it does outlives it: its requests are served with a throw-away entry cache in place of the
engine's (``engine.cache``, the server's segment store: none of their entries is stored) under the
tenant ``WARM_TENANT``; every pool slot and page goes back; the prefix-cache nodes it made are evicted
(its pair is skipped when the radix cache was not empty); the scheduler's counters and the radix
cache's are put back as they were; the scheduler's engine thread is stopped again (the next submit
starts it). What stays is what it is for: compiled kernels, autotune results and the captured
decode and stage graphs. The combine and cold-core graphs are per layout (``combine_graph_after``,
``cold_graph_after``): a synthetic layout run once is not captured (with ``*_graph_after`` <= 1 it
is, and is the first to go when real layouts need the room); their sighting counts keep the
warm-up's. Call it before the engine serves anything (``api/serve.py`` does, before it listens).

``persisted_compile_cache(home)``: Triton's on-disk caches under ``<home>/triton`` for ``serve``
(``TRITON_CACHE_DIR``, unless set) with autotune results kept there too (``TRITON_CACHE_AUTOTUNING``,
unless set: Triton 3.6 then writes every autotuner's timings next to the binaries, fla's included),
so a second start compiles and tunes nothing. CUDA graphs cannot be kept: they are captured again.
"""

from __future__ import annotations

import logging
import os
import queue
import time
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hypic_agent.config import Settings
from hypic_agent.runtime.hypic.cache import MemoryEntryCache
from hypic_agent.runtime.hypic.modes import mode_spec
from hypic_agent.runtime.results import FinishEvent
from hypic_agent.runtime.runner.decode_graphs import decode_buckets
from hypic_agent.runtime.runner.pool import PoolSeq
from hypic_agent.runtime.runner.stage_graphs import bucket_sizes
from hypic_agent.runtime.sampling import SamplingParams
from hypic_agent.runtime.scheduler.request import GenerationRequest
from hypic_agent.runtime.serving import Serving

log = logging.getLogger("hypic.warm_start")

WARM_TENANT = "hypic-warm-start"  # the tenant of every warm-up request (its keys are nobody else's)
CPU_PREFILL_TOKENS = (64,)  # auto prefill sizes off CUDA: nothing compiles there, the path runs once
QUERY_TOKENS = 16  # the composed requests' question
EVENT_TIMEOUT_S = 1800.0  # a warm-up request silent this long is a hang, not a slow autotune
TRITON_DIR = "triton"  # under Settings.home

Progress = Callable[..., Any]  # ``startup.StartupLog``: progress(msg) / progress(msg, done=, total=, unit=)


@dataclass
class WarmStartReport:
    """What ``warm_up`` ran."""

    decode_buckets: tuple[int, ...] = ()  # batch sizes run as one decode-only forward each
    prefill_tokens: tuple[int, ...] = ()  # prompt sizes prefilled (full_recompute)
    prefix_cache: bool = False  # the prefix_cache pair ran
    composed_modes: tuple[str, ...] = ()  # modes whose cold + warm request ran
    segments: tuple[int, ...] = ()  # the composed requests' segment lengths
    skipped: list[str] = field(default_factory=list)  # what did not fit the pool, and why
    seconds: float = 0.0


@dataclass(frozen=True)
class _Seg:
    token_ids: tuple[int, ...]
    kind: str = "document"


@dataclass(frozen=True)
class _Plan:
    """A synthetic prompt (``prompt_pieces.PlanLike``)."""

    segments: tuple[_Seg, ...]
    suffix_ids: tuple[int, ...] = ()
    bos_id: int | None = None


def synthetic_ids(n: int, salt: int, vocab: int) -> tuple[int, ...]:
    """``n`` token ids in ``[0, vocab)``, a different sequence per ``salt`` (distinct entry keys)."""
    return tuple((salt * 7919 + i * 104729 + 13) % vocab for i in range(n))


def decode_sizes(serving: Serving) -> tuple[int, ...]:
    """The decode batch buckets to run: the runner's decode graphs' (CUDA), else the ones they would
    have (``decode_buckets`` up to ``decode_graph_max_batch``, capped by the pool's slots)."""
    graphs = serving.runner.decode_graphs
    if graphs is not None:
        return tuple(graphs.buckets)
    s = serving.engine.settings
    return decode_buckets(min(s.decode_graph_max_batch, serving.pool.n_slots))


def prefill_sizes(serving: Serving) -> tuple[int, ...]:
    """Prompt sizes to prefill (module doc): ``warm_start_prefill_tokens``, or auto; each at most
    ``prefill_chunk_tokens`` and what one request may hold (pool and context window, less its one
    new token), ascending, without repeats."""
    engine = serving.engine
    s = engine.settings
    sizes: Sequence[int] = s.warm_start_prefill_tokens
    if not sizes:
        if serving.pool.device.type == "cuda":
            stages = engine.runner.graphs.stages
            k = engine.kernels
            buckets = stages.buckets if stages is not None else bucket_sizes(k.graph_bucket_step, k.graph_max_tokens)
            sizes = [*buckets, *(b - 3 for b in buckets if b >= 16), s.prefill_chunk_tokens]
        else:
            sizes = CPU_PREFILL_TOKENS
    cap = min(s.prefill_chunk_tokens, _request_cap(serving) - 1)
    return tuple(sorted({min(n, cap) for n in sizes if n > 0 and cap > 0}))


def _request_cap(serving: Serving) -> int:
    """Tokens (prompt + new) one request may hold: the pool's longest sequence, the context window."""
    pool = serving.pool
    return min(serving.engine.max_context, pool.max_seq_pages * pool.page_size)


def composed_segments(serving: Serving, new_tokens: int = 2) -> tuple[int, ...]:
    """``warm_start_segments``, the longest leading run of them whose prompt (with the question and
    ``new_tokens``) fits one request."""
    room = _request_cap(serving) - QUERY_TOKENS - new_tokens
    out: list[int] = []
    for n in serving.engine.settings.warm_start_segments:
        if n > room:
            break
        out.append(n)
        room -= n
    return tuple(out)


# ---------------------------------------------------------------------------- the warm-up
def warm_up(serving: Serving, progress: Progress | None = None) -> WarmStartReport:
    """Warm ``serving`` (module doc) before it serves anything; returns what ran. ``progress``: a
    ``startup.StartupLog`` (one counted report per decode bucket, prompt and composed request, then a
    line with the stage's seconds)."""
    say: Progress = progress if progress is not None else (lambda *a, **k: None)
    t0 = time.perf_counter()
    engine, sched = serving.engine, serving.scheduler
    report = WarmStartReport()
    stats = dict(vars(sched.stats))
    radix = sched.radix
    radix_counts = (radix.hits, radix.hit_tokens, radix.inserts, radix.evicted_nodes)
    radix_was_empty = radix.stats().nodes == 0
    with engine.lock:
        user_cache, engine.cache = engine.cache, MemoryEntryCache(0)  # nothing reaches the user's store
    try:
        _decode_buckets(serving, say, report)
        _prefills(serving, say, report, prefix_pair=radix_was_empty)
        _composed(serving, say, report)
    finally:
        serving.stop()  # the engine thread the warm-up started; the next submit starts it again
        with engine.lock:
            engine.cache = user_cache
            if report.prefix_cache:
                radix.clear()  # only its nodes: the cache was empty before
            radix.hits, radix.hit_tokens, radix.inserts, radix.evicted_nodes = radix_counts
            for name, value in stats.items():
                setattr(sched.stats, name, value)
        _sync(serving.pool.device)
    report.seconds = time.perf_counter() - t0
    parts = [
        f"{len(report.decode_buckets)} decode buckets",
        f"{len(report.prefill_tokens) + 2 * report.prefix_cache} prefills",
        f"{2 * len(report.composed_modes)} composed requests",
    ]
    say(f"warm start took {report.seconds:.1f} s ({', '.join(parts)})")
    for why in report.skipped:
        log.warning("warm start: %s", why)
    return report


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _decode_buckets(serving: Serving, say: Progress, report: WarmStartReport) -> None:
    """One decode-only forward of exactly ``b`` rows per bucket ``b`` (captures its decode graph on
    CUDA), over ``b`` fresh pool sequences of one page each, freed right after."""
    engine, pool, runner = serving.engine, serving.pool, serving.runner
    buckets = decode_sizes(serving)
    vocab = engine.model.config.vocab_size
    msg = "warming up: decode buckets"
    ran: list[int] = []
    for i, b in enumerate(buckets):
        with engine.lock:
            seqs: list[PoolSeq] = []
            try:
                for _ in range(b):
                    seq = pool.alloc(1)
                    if seq is None:
                        break
                    seqs.append(seq)
                if len(seqs) == b:
                    ids = synthetic_ids(b, 1, vocab)
                    runner.forward(runner.plan(seqs, [(t,) for t in ids]))
                    ran.append(b)
                else:
                    report.skipped.append(
                        f"decode batch {b}: the pool has {len(seqs)} free slots and pages for one-token "
                        "sequences; that bucket is captured on first use"
                    )
            finally:
                for seq in seqs:
                    pool.free(seq)
        say(msg, done=i + 1, total=len(buckets), unit="buckets")
    _sync(pool.device)
    report.decode_buckets = tuple(ran)


def _run(serving: Serving, plan: _Plan, mode: str, max_tokens: int) -> FinishEvent:
    """One request through the scheduler, to its end (greedy, ``ignore_eos``)."""
    sampling = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    handle = serving.scheduler.submit(GenerationRequest(plan, sampling, mode, None, WARM_TENANT))
    last: Any = None
    try:
        for ev in handle.events(timeout=EVENT_TIMEOUT_S):
            last = ev
    except queue.Empty as e:
        raise TimeoutError(f"a warm-up request ({mode}) sent nothing for {EVENT_TIMEOUT_S:.0f} s") from e
    if not isinstance(last, FinishEvent):
        raise RuntimeError(f"a warm-up request ({mode}) ended without finishing")
    return last


def _prefills(serving: Serving, say: Progress, report: WarmStartReport, *, prefix_pair: bool) -> None:
    """A full_recompute prompt of each ``prefill_sizes`` size (one new token), alone in its steps;
    then, when ``prefix_pair`` (the radix cache is empty), a ``prefix_cache`` request over the first
    two of ``composed_segments`` and one that resumes its prefix (none without two segments or
    without snapshot rows, ``prefix_snapshots``)."""
    vocab = serving.engine.model.config.vocab_size
    sizes = prefill_sizes(serving)
    segs = composed_segments(serving)[:2]
    pair = prefix_pair and len(segs) == 2 and serving.pool.n_snapshots > 0
    total = len(sizes) + 2 * pair
    msg = "warming up: prefill"
    for i, n in enumerate(sizes):
        _run(serving, _Plan((_Seg(synthetic_ids(n, 100 + i, vocab)),)), "full_recompute", 1)
        say(msg, done=i + 1, total=total, unit="prompts")
    report.prefill_tokens = sizes
    if pair:
        body = tuple(_Seg(synthetic_ids(n, 200 + j, vocab)) for j, n in enumerate(segs))
        for q in range(2):
            _run(serving, _Plan(body, synthetic_ids(QUERY_TOKENS, 300 + q, vocab)), "prefix_cache", 2)
            say(msg, done=len(sizes) + q + 1, total=total, unit="prompts")
        report.prefix_cache = True


def _composed(serving: Serving, say: Progress, report: WarmStartReport) -> None:
    """Per composed mode a request over ``composed_segments`` with every segment cold, then the same
    segments with another question (every segment a hit)."""
    engine = serving.engine
    vocab = engine.model.config.vocab_size
    modes = ["hypic"]
    default = engine.settings.default_mode
    if default not in modes and mode_spec(default).composed:
        modes.append(default)
    segs = composed_segments(serving)
    if not segs:
        if engine.settings.warm_start_segments:
            report.skipped.append("composed requests: the first of warm_start_segments does not fit one request")
        return
    msg = "warming up: composed requests"
    for m, mode in enumerate(modes):
        body = tuple(_Seg(synthetic_ids(n, 400 + 10 * m + j, vocab)) for j, n in enumerate(segs))
        for q in range(2):  # cold, then warm
            _run(serving, _Plan(body, synthetic_ids(QUERY_TOKENS, 500 + 10 * m + q, vocab)), mode, 2)
            say(msg, done=2 * m + q + 1, total=2 * len(modes), unit="requests")
    report.composed_modes = tuple(modes)
    report.segments = segs


def wants_warm_start(settings: Settings, device: torch.device | str) -> bool:
    """``Settings.warm_start`` resolved for an engine on ``device``: ``auto`` = on a CUDA device only."""
    if settings.warm_start == "auto":
        return str(device).startswith("cuda")
    return bool(settings.warm_start)


def warm_start_stage(serving: Serving, progress: Progress, triton_dir: str | None = None) -> None:
    """``warm_up`` as a start-up stage of ``serve`` (``Settings.warm_start``: auto = on a CUDA device only),
    in-process or in the engine process (``runtime.core_process``). A failure is logged, not fatal: the
    server then compiles and captures on first use, as it would without."""
    engine = serving.engine
    if not wants_warm_start(engine.settings, engine.device):
        if engine.settings.warm_start == "auto":
            progress(f"no warm start on {engine.device.type}: nothing compiles there (HYPIC_WARM_START=true runs it)")
        return
    where = f"; Triton kernels and autotune results kept in {triton_dir}" if triton_dir else ""
    progress(f"warming up: compiling and capturing before listening (HYPIC_WARM_START=false skips it{where})")
    try:
        warm_up(serving, progress)
    except Exception:
        log.exception("warm start failed; requests compile and capture on first use what it did not")


# ---------------------------------------------------------------------------- compile caches
@contextmanager
def persisted_compile_cache(home: Path, environ: MutableMapping[str, str] | None = None) -> Iterator[dict[str, str]]:
    """For the block (a ``serve``'s life): Triton's kernel cache in ``<home>/triton``
    (``TRITON_CACHE_DIR``) with autotune results kept there as well (``TRITON_CACHE_AUTOTUNING=1``),
    each only where ``environ`` (default ``os.environ``) does not set it already; yields what it set
    and puts ``environ`` back afterwards. Enter it before any Triton kernel is imported or compiled
    (an autotuner reads ``TRITON_CACHE_AUTOTUNING`` when its kernel module is imported); scatter
    workers started inside inherit it."""
    env = os.environ if environ is None else environ
    wanted = {"TRITON_CACHE_DIR": str(home / TRITON_DIR), "TRITON_CACHE_AUTOTUNING": "1"}
    added = {k: v for k, v in wanted.items() if k not in env}
    if "TRITON_CACHE_DIR" in added:
        Path(added["TRITON_CACHE_DIR"]).mkdir(parents=True, exist_ok=True)
    env.update(added)
    try:
        yield dict(added)
    finally:
        for k, v in added.items():
            if env.get(k) == v:
                del env[k]
