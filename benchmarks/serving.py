"""Decode through the runner, the scheduler and HTTP in one run, and the TTFT a server shows right
after start-up, steady, and idle per mode.

Rows: ``batch`` requests of ``context`` prompt tokens decode together, three ways (``--paths``):

* ``runner``: ``decode.py``'s loop (``_common.decode_step_ms``) on the engine's own runner and state
  pool: plan -> forward (replayed from the batch bucket's CUDA graph) -> argmax -> one read-back.
* ``scheduler``: the engine as the server builds it (``load_engine`` + ``ServerState``); each body
  goes through the route's edge work (``routes.generate.prepare``: tokenize, plan) and is submitted
  to the scheduler; token times are taken as the scheduler emits them (a sink, as the API consumes
  its events).
* ``http``: ``hypic-agent serve`` in its own process on 127.0.0.1 (``_common.ServeProcess``) and
  ``batch`` concurrent streaming clients (``POST /v1/generate``, ``stream: true``, SSE, one asyncio
  loop here); token times at the client.

Every request has its own random text (``full_recompute``: nothing is shared between them). Only
tokens after the LAST request of the batch got its first token are counted (no prefill in those
steps), ``--decode-tokens`` per request; then all are cancelled (over HTTP: the client
disconnects) and the scheduler is drained before the next row. tokens/s = the sum over requests of
(counted tokens - 1) / (time from their first to their last counted token); TPOT p50 = the median
over requests of that time per token. Runner: batch x steps / their time; TPOT = the mean step
(the same for every sequence); ``step_p50_ms`` is ``decode.py``'s ms/step.

The runner and scheduler paths run in a spawned child process that exits before the server
starts: one GPU does not hold two copies of the 35B model. Both load the same ``random:`` model
(the shape's config, seeded weights) with the same settings (``HYPIC_*``; the KV pool sized for
the largest batch at the largest context + ``max_tokens``).

TTFT, through HTTP: the first request after the server's ``"listening"`` line (``full_recompute``
at the first context; ``first_request_ttft_ms``), then the same request ``--ttft-reps`` times
(p50: ``steady_ttft_ms``); the server's start-up (spawn -> ``"listening"``, and each start-up log
line's time). Idle TTFT per ``--idle-modes``, one request at a time at the largest context: one
set of ``--seg-len`` documents in a new order each time (``ttft.py``'s warm row), p50 of
``--idle-reps`` after ``--idle-warmup``; beside it ``prefill.py``'s measurement of the same
prompt's tokens (``runner.standalone.prefill``, median of ``--prefill-reps``) in the child.

Prompts are ASCII text read by the byte-level tokenizer a random-weight server uses (one token per
character; each segment's framing counted with ``build_plan``), so every prompt is exactly its
row's context. The server's log goes to ``<out stem>.server.log``. The child and the server share
one Triton cache (``TRITON_CACHE_DIR``, default Triton's own ``~/.triton/cache``, with
``TRITON_CACHE_AUTOTUNING=1``): the server's start-up (its warm start included) finds what the
child compiled and tuned, as a server restarted with the same cache would.

    python benchmarks/serving.py --shape qwen3_5_35b_a3b --out docs/results/serving_h200.json
    python benchmarks/serving.py --shape tiny:qwen3_5_text --device cpu --batches 1 2 --contexts 64 --decode-tokens 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import traceback
from bisect import bisect_right
from functools import cache, partial
from pathlib import Path
from typing import Any

import httpx
import torch
from _common import ServeProcess, decode_step_ms, load_shape, model_args, print_table, timed, write_json
from load import metric
from qps import pct

from hypic_agent.api.schemas import GenerateRequest
from hypic_agent.config import Settings
from hypic_agent.runtime.models.loading.tokenizer import tiny_tokenizer
from hypic_agent.runtime.results import FinishEvent, TokenEvent
from hypic_agent.runtime.scheduler.request import END
from hypic_agent.segments.prompt.keys import KeyContext
from hypic_agent.segments.prompt.plan import PromptPlan, build_plan

PATHS = ("runner", "scheduler", "http")
LETTERS = "abcdefghijklmnopqrstuvwxyz"
DRAIN_S = 120.0  # bound on waiting for the scheduler to be empty after a row

# --------------------------------------------------------------------------- prompts


def text(rng: random.Random, n: int) -> str:
    """``n`` characters of random lower-case words, single spaces, no space at either end."""
    words, size = [], -1  # size: the joined length
    while size < n:
        w = "".join(rng.choices(LETTERS, k=rng.randint(2, 9)))
        words.append(w)
        size += len(w) + 1
    s = " ".join(words)[:n]
    return s[:-1] + rng.choice(LETTERS) if s.endswith(" ") else s


def rag_body(docs: list[str], query: str, mode: str, max_tokens: int) -> dict[str, Any]:
    return {
        "segments": [{"kind": "document", "text": d} for d in docs],
        "query": query,
        "mode": mode,
        "max_tokens": max_tokens,
        "stream": True,
    }


@cache
def tokenizer() -> Any:
    return tiny_tokenizer()  # what a random:/tiny: server reads prompts with


def prompt_plan(body: dict[str, Any]) -> PromptPlan:
    """The prompt the server builds from ``body`` (framing, tokens) with the byte-level tokenizer."""
    req = GenerateRequest.model_validate(body)
    return build_plan([s.to_segment() for s in req.segments], req.query, tokenizer(), KeyContext("serving-bench"))


@cache
def framing(n_docs: int) -> int:
    """Prompt tokens of ``n_docs`` documents and a query beyond their characters (one token each)."""
    return prompt_plan(rag_body(["a"] * n_docs, "q", "full_recompute", 1)).total_tokens - n_docs - 1


def layout(context: int, seg_len: int, query_len: int) -> tuple[int, int, int]:
    """``(documents, characters per document, query characters)`` of a prompt of exactly ``context``
    tokens: documents of equal length (one layout whatever their order), the rest in the query."""
    n = max(1, context // seg_len)
    q = min(query_len, max(1, context // 8))
    per = (context - framing(n) - q) // n
    if per < 1:
        raise SystemExit(f"context {context} is too short for {n} documents and a query")
    return n, per, context - framing(n) - n * per


def check_tokens(bodies: list[dict[str, Any]], context: int) -> None:
    for b in bodies:
        got = prompt_plan(b).total_tokens
        if got != context:
            raise RuntimeError(f"a prompt meant to be {context} tokens is {got}")


def row_bodies(args: argparse.Namespace, batch: int, context: int, salt: str, max_tokens: int) -> list[dict[str, Any]]:
    """``batch`` ``full_recompute`` bodies of ``context`` tokens, each with its own documents and query
    (seeded: the same in every process)."""
    n, per, q = layout(context, args.seg_len, args.query_len)
    out = []
    for i in range(batch):
        rng = random.Random(f"{args.seed}/{salt}/{batch}/{context}/{i}")
        out.append(rag_body([text(rng, per) for _ in range(n)], text(rng, q), "full_recompute", max_tokens))
    check_tokens(out, context)
    return out


def idle_bodies(args: argparse.Namespace, context: int, mode: str, count: int) -> list[dict[str, Any]]:
    """``count`` bodies of one set of documents, each in its own order, and one query."""
    n, per, q = layout(context, args.seg_len, args.query_len)
    rng = random.Random(f"{args.seed}/idle/{context}")
    docs = [text(rng, per) for _ in range(n)]
    query = text(rng, q)
    out = []
    for i in range(count):
        order = list(range(n))
        random.Random(f"{args.seed}/order/{i}").shuffle(order)
        out.append(rag_body([docs[j] for j in order], query, mode, 2))
    check_tokens(out[:1], context)
    return out


# --------------------------------------------------------------------------- decode windows


class Tracker:
    """One streamed request: its token arrival times (``perf_counter`` s) and how it ended."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.done = False
        self.error: str | None = None
        self.finish: str | None = None

    def sink(self, item: Any) -> None:
        """The scheduler's event sink (engine thread: must not block or raise)."""
        if isinstance(item, TokenEvent):
            if item.token_id is not None:
                self.times.append(time.perf_counter())
        elif isinstance(item, FinishEvent):
            self.finish = item.finish_reason
        elif isinstance(item, BaseException):
            self.error = repr(item)
        elif item is END:
            self.done = True


def window_start(trackers: list[Tracker]) -> float | None:
    """When the last request of the batch got its first token (None: not yet)."""
    if not all(t.times for t in trackers):
        return None
    return max(t.times[0] for t in trackers)


def counted(tr: Tracker, t_s: float, n: int) -> list[float]:
    """The first ``n`` token times of ``tr`` after ``t_s``."""
    i = bisect_right(tr.times, t_s)
    return tr.times[i : i + n]


def ready(trackers: list[Tracker], n: int) -> bool:
    """Whether every request has ``n`` tokens after the window start (or has ended); raises a
    request's error."""
    for t in trackers:
        if t.error:
            raise RuntimeError(f"a request failed: {t.error}")
    t_s = window_start(trackers)
    if t_s is None:
        return all(t.done for t in trackers)
    return all(t.done or len(counted(t, t_s, n)) >= n for t in trackers)


def window_stats(trackers: list[Tracker], n: int, t_submit: float) -> dict[str, Any]:
    t_s = window_start(trackers)
    if t_s is None:
        raise RuntimeError("a request ended without any token")
    spans = [counted(t, t_s, n) for t in trackers]
    tpots = [(c[-1] - c[0]) / (len(c) - 1) for c in spans if len(c) >= 2 and c[-1] > c[0]]
    if not tpots:
        raise RuntimeError("no request decoded two tokens after the last first token")
    if short := sum(1 for c in spans if len(c) < n):
        print(f"note: {short} of {len(spans)} requests ended (EOS or max_tokens) before {n} counted tokens", flush=True)
    return {
        "tokens_per_s": sum(1 / x for x in tpots),
        "tpot_p50_ms": pct(tpots, 0.5) * 1e3,
        "window_tokens": sum(len(c) for c in spans),
        "short_requests": short,  # ended before n counted tokens: the batch was not full throughout
        "ramp_s": t_s - t_submit,  # submit -> the last first token (the batch's prefill)
    }


def wait_until(cond: Any, timeout_s: float, what: str) -> None:
    deadline = time.perf_counter() + timeout_s
    while not cond():
        if time.perf_counter() > deadline:
            raise TimeoutError(f"{what} took more than {timeout_s:g} s")
        time.sleep(0.01)


# --------------------------------------------------------------------------- in-process paths (child)


def inprocess(args: argparse.Namespace, env: dict[str, str], max_tokens: int) -> dict[str, Any]:
    """The runner and scheduler rows and the prefill times, on the engine ``serve`` would build."""
    os.environ.update(env)

    from hypic_agent.api import service
    from hypic_agent.api.metrics import Metrics
    from hypic_agent.api.routes.generate import prepare
    from hypic_agent.api.state import ServerState
    from hypic_agent.runtime.loader import load_engine
    from hypic_agent.runtime.main_thread import off_main_thread
    from hypic_agent.runtime.runner.standalone import prefill
    from hypic_agent.segments.store.segment_store import SegmentStore

    settings = Settings()

    def start() -> Any:  # on a thread that exits, as serve does (no OpenMP pool left on this one)
        engine = load_engine(settings)
        return ServerState.build(settings, engine, SegmentStore.from_settings(settings), Metrics(), owns_store=True)

    t0 = time.perf_counter()
    st = off_main_thread(start)
    print(f"in-process engine ready in {time.perf_counter() - t0:.1f} s", flush=True)
    sched = st.serving.scheduler
    dev = torch.device(settings.device) if settings.device != "auto" else next(st.engine.model.parameters()).device
    out: dict[str, Any] = {
        "rows": [],
        "prefill_ms": {},
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
    }

    def drained() -> bool:
        snap = sched.snapshot()
        return snap["waiting"] + snap["preparing"] + snap["running"] == 0

    def scheduler_row(bodies: list[dict[str, Any]], n: int) -> dict[str, Any]:
        jobs = []
        for b in bodies:  # the route's edge work, before the clock
            req = GenerateRequest.model_validate(b)
            jobs.append(prepare(st, req, [s.to_segment() for s in req.segments], "default"))
        trackers = [Tracker() for _ in jobs]
        prefilled: list[int] = []  # the scheduler's prefill tokens when the window was seen to start, at its end

        def poll() -> bool:
            done = ready(trackers, n)
            if not prefilled and window_start(trackers) is not None:
                prefilled.append(sched.stats.prefill_tokens)
            return done

        handles = []
        t_submit = time.perf_counter()
        try:
            for job, tr in zip(jobs, trackers, strict=True):
                handles.append(service.submit_job(st, job, tr.sink))
            wait_until(poll, args.row_timeout_s, "a scheduler row")
            prefilled.append(sched.stats.prefill_tokens)
        finally:
            for h in handles:
                h.cancel()
            wait_until(drained, DRAIN_S, "draining the scheduler")
        return window_stats(trackers, n, t_submit) | {"prefill_tokens_in_window": prefilled[-1] - prefilled[0]}

    try:
        if "runner" in args.paths:
            for context in args.contexts:
                for batch in args.batches:
                    runner, pool = st.serving.runner, st.serving.pool
                    times = off_main_thread(
                        partial(decode_step_ms, runner, pool, batch, context, args.decode_tokens, args.runner_warmup)
                    )
                    if times is None:
                        raise RuntimeError(f"the pool does not hold {batch} x {context} tokens")
                    mean = sum(times) / len(times)
                    row = {
                        "path": "runner",
                        "batch": batch,
                        "context": context,
                        "tokens_per_s": batch / mean * 1e3,
                        "tpot_p50_ms": mean,
                        "step_p50_ms": pct(times, 0.5),
                        "window_tokens": batch * len(times),
                    }
                    out["rows"].append(row)
                    print({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
        if "scheduler" in args.paths:
            for batch in args.batches:  # warm-up: each batch's decode graph bucket, the prefill shapes
                scheduler_row(row_bodies(args, batch, min(args.contexts), "warm", max_tokens), 2)
            for context in args.contexts:
                for batch in args.batches:
                    bodies = row_bodies(args, batch, context, "row", max_tokens)
                    row = {"path": "scheduler", "batch": batch, "context": context}
                    row.update(scheduler_row(bodies, args.decode_tokens))
                    out["rows"].append(row)
                    print({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
        for context in args.contexts:  # prefill.py's measurement, of the idle requests' prompt
            ids = prompt_plan(idle_bodies(args, context, "full_recompute", 1)[0]).token_ids()
            s, _ = off_main_thread(partial(timed, partial(prefill, st.engine.model, [ids]), reps=args.prefill_reps))
            out["prefill_ms"][str(context)] = s * 1e3
            print(f"prefill {context} tokens: {s * 1e3:.1f} ms", flush=True)
    finally:
        st.close()
    return out


def _child(args: argparse.Namespace, env: dict[str, str], max_tokens: int, conn: Any) -> None:
    try:
        conn.send(("ok", inprocess(args, env, max_tokens)))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def run_inprocess(args: argparse.Namespace, env: dict[str, str], max_tokens: int) -> dict[str, Any]:
    """``inprocess`` in a spawned child; its memory (the model, the pool) is gone when this returns."""
    ctx = mp.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(args, env, max_tokens, send), name="serving-inprocess")
    proc.start()
    send.close()
    try:
        deadline = time.monotonic() + args.child_timeout_s
        while not recv.poll(0.5):
            if not proc.is_alive():
                raise RuntimeError(f"the in-process phase exited ({proc.exitcode}) without a result")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the in-process phase took more than {args.child_timeout_s:g} s")
        try:
            status, payload = recv.recv()
        except EOFError as e:
            raise RuntimeError(f"the in-process phase exited ({proc.exitcode}) without a result") from e
        if status != "ok":
            raise RuntimeError(f"the in-process phase failed:\n{payload}")
        proc.join(60)
        return payload
    finally:
        if proc.is_alive():
            proc.terminate()
            proc.join(30)
        if proc.is_alive():
            proc.kill()
            proc.join(30)


# --------------------------------------------------------------------------- HTTP path (this process)


async def stream_tokens(client: httpx.AsyncClient, body: dict[str, Any], tr: Tracker) -> None:
    """``POST /v1/generate`` streamed: each SSE token event's arrival into ``tr``."""
    try:
        async with client.stream("POST", "/v1/generate", json=body) as r:
            if r.status_code != 200:
                tr.error = f"HTTP {r.status_code}: {(await r.aread())[:300]!r}"
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                now = time.perf_counter()
                if line == "data: [DONE]":
                    break
                ev = json.loads(line[6:])
                if "error" in ev:
                    tr.error = str(ev["error"])
                    break
                if ev.get("token_id") is not None:
                    tr.times.append(now)
                if ev.get("finish_reason"):
                    tr.finish = ev["finish_reason"]
    except (httpx.HTTPError, ValueError) as e:
        tr.error = repr(e)
    finally:
        tr.done = True


async def server_drained(client: httpx.AsyncClient) -> None:
    """Wait (at most ``DRAIN_S``) until ``/metrics`` shows no request in the scheduler."""
    deadline = time.perf_counter() + DRAIN_S
    while True:
        body = (await client.get("/metrics")).text
        busy = sum(
            metric(body, f'hypic_scheduler_requests{{state="{s}"}}') or 0 for s in ("waiting", "preparing", "running")
        )
        if busy == 0:
            return
        if time.perf_counter() > deadline:
            raise TimeoutError(f"the server still has {busy:g} requests {DRAIN_S:g} s after a row")
        await asyncio.sleep(0.02)


async def prefill_tokens(client: httpx.AsyncClient) -> float:
    return metric((await client.get("/metrics")).text, "hypic_scheduler_prefill_tokens_total") or 0.0


async def http_row(url: str, bodies: list[dict[str, Any]], n: int, timeout_s: float) -> dict[str, Any]:
    trackers = [Tracker() for _ in bodies]
    limits = httpx.Limits(max_connections=len(bodies) + 2, max_keepalive_connections=len(bodies) + 2)
    prefilled: list[float] = []  # the server's prefill tokens when the window was seen to start, at its end
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s, limits=limits) as client:
        t_submit = time.perf_counter()
        tasks = [asyncio.create_task(stream_tokens(client, b, t)) for b, t in zip(bodies, trackers, strict=True)]
        try:
            deadline = t_submit + timeout_s
            while not ready(trackers, n):
                if not prefilled and window_start(trackers) is not None:
                    prefilled.append(await prefill_tokens(client))
                if time.perf_counter() > deadline:
                    raise TimeoutError(f"an HTTP row took more than {timeout_s:g} s")
                await asyncio.sleep(0.005)
            prefilled.append(await prefill_tokens(client))
        finally:
            for task in tasks:
                task.cancel()  # the client disconnects: the server cancels the request
            await asyncio.gather(*tasks, return_exceptions=True)
        await server_drained(client)
    return window_stats(trackers, n, t_submit) | {"prefill_tokens_in_window": prefilled[-1] - prefilled[0]}


async def ttft_ms(client: httpx.AsyncClient, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """Send ``body`` streamed and read it to the end: ms to the first SSE event, the finish event."""
    t0 = time.perf_counter()
    first, fin = None, {}
    async with client.stream("POST", "/v1/generate", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            first = first or time.perf_counter()
            if line == "data: [DONE]":
                break
            ev = json.loads(line[6:])
            if "error" in ev:
                raise RuntimeError(f"the request failed: {ev['error']}")
            if "usage" in ev:
                fin = ev
    if first is None:
        raise RuntimeError("no event")
    return (first - t0) * 1e3, fin


def server_ttft(fin: dict[str, Any]) -> float:
    return float(fin.get("timings", {}).get("ttft_ms", float("nan")))


async def http_phase(args: argparse.Namespace, url: str, max_tokens: int, res: dict[str, Any]) -> None:
    timeout = httpx.Timeout(args.row_timeout_s)
    async with httpx.AsyncClient(base_url=url, timeout=timeout) as client:
        context = args.ttft_context or args.contexts[0]
        body = {**row_bodies(args, 1, context, "ttft", 2)[0], "mode": args.ttft_mode}
        first, fin = await ttft_ms(client, body)  # the first request the server sees
        reps = [await ttft_ms(client, body) for _ in range(args.ttft_reps)]
        steady = [ms for ms, _ in reps]
        res.update(first_request_ttft_ms=first, steady_ttft_ms=pct(steady, 0.5), steady_ttft_all_ms=steady)
        res.update(ttft_context=context, ttft_mode=args.ttft_mode)
        # the server's own TTFT (timings.ttft_ms: arrival at the route -> first token), the rest is HTTP
        res["first_request_server_ttft_ms"] = server_ttft(fin)
        res["steady_server_ttft_ms"] = pct([server_ttft(f) for _, f in reps], 0.5)
        # where the server's time went (queue, engine TTFT, ...): the first request's and the last repeat's
        res["first_request_timings"], res["steady_timings"] = fin.get("timings"), reps[-1][1].get("timings")
        p50 = pct(steady, 0.5)
        print(f"TTFT ({args.ttft_mode}, {context} tokens): first request {first:.1f} ms, steady p50 {p50:.1f} ms")
    for batch in args.batches:  # warm-up, as in the child
        await http_row(url, row_bodies(args, batch, min(args.contexts), "warm", max_tokens), 2, args.row_timeout_s)
    for context in args.contexts:
        for batch in args.batches:
            bodies = row_bodies(args, batch, context, "row", max_tokens)
            row = {"path": "http", "batch": batch, "context": context}
            row.update(await http_row(url, bodies, args.decode_tokens, args.row_timeout_s))
            res["rows"].append(row)
            print({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
    context = max(args.contexts)
    async with httpx.AsyncClient(base_url=url, timeout=timeout) as client:
        for mode in args.idle_modes:
            times, fins = [], []
            for b in idle_bodies(args, context, mode, args.idle_warmup + args.idle_reps):
                ms, fin = await ttft_ms(client, b)
                times.append(ms)
                fins.append(fin)
            kept = times[args.idle_warmup :]
            res["idle_ttft_ms"][mode] = pct(kept, 0.5)
            res["idle_ttft_all_ms"][mode] = times
            res["idle_server_ttft_ms"][mode] = pct([server_ttft(f) for f in fins[args.idle_warmup :]], 0.5)
            usage = fins[-1].get("usage", {})
            res["idle_usage"][mode] = {k: usage.get(k) for k in ("prompt_tokens", "cached_tokens", "recomputed_tokens")}
            print(f"idle TTFT {mode} at {context} tokens: p50 {pct(kept, 0.5):.1f} ms ({res['idle_usage'][mode]})")


# --------------------------------------------------------------------------- report


def report(res: dict[str, Any], args: argparse.Namespace) -> None:
    if res.get("startup_stages"):
        print_table(res["startup_stages"], ["t_s", "elapsed_s", "msg"])
    cols = [
        "path",
        "batch",
        "context",
        "tokens_per_s",
        "tpot_p50_ms",
        "window_tokens",
        "ramp_s",
        "prefill_tokens_in_window",
    ]
    print_table(res["rows"], cols)
    by = {(r["path"], r["batch"], r["context"]): r["tokens_per_s"] for r in res["rows"]}
    ratios = []
    for context in args.contexts:
        for batch in args.batches:
            base = by.get(("runner", batch, context))
            if not base:
                continue
            ratio: dict[str, Any] = {"batch": batch, "context": context}
            for p in ("scheduler", "http"):
                if (p, batch, context) in by:
                    ratio[f"{p}/runner"] = by[(p, batch, context)] / base
            ratios.append(ratio)
    if ratios:
        print_table(ratios, ["batch", "context", "scheduler/runner", "http/runner"])
    res["ratios"] = ratios
    checks = []

    def check(name: str, value: float | None, target: str, ok: bool) -> None:
        if value is not None:
            checks.append({"check": name, "value": value, "target": target, "met": ok})

    for batch, floor in ((64, 0.90), (16, 0.85)):
        r = next((x for x in ratios if x["batch"] == batch and x["context"] == 2048 and "http/runner" in x), None)
        if r:
            check(
                f"http / runner tokens/s, batch {batch} at 2k",
                r["http/runner"],
                f">= {floor}",
                r["http/runner"] >= floor,
            )
    if "first_request_ttft_ms" in res:
        x = res["first_request_ttft_ms"] / res["steady_ttft_ms"]
        check("first request TTFT / steady TTFT", x, "<= 2", x <= 2)
    if res.get("startup_s") is not None:
        check("start-up s (spawn -> listening)", res["startup_s"], "<= 120", res["startup_s"] <= 120)
    idle, pre = res["idle_ttft_ms"].get("full_recompute"), res["prefill_ms"].get(str(max(args.contexts)))
    if idle and pre:
        x = idle / pre
        # what serving adds over prefill.py's forward: at most 10% (HTTP faster than prefill.py's fresh-pool
        # forward is no overhead at all; on 2026-12-07 it was, 273 against 313 ms on an H100)
        check(f"idle full_recompute TTFT / prefill.py at {max(args.contexts)}", x, "<= 1.1", x <= 1.10)
    res["checks"] = checks
    if res["idle_ttft_ms"]:
        print_table(
            [
                {"mode": m, "idle_ttft_ms": v, "server_ttft_ms": res["idle_server_ttft_ms"].get(m), "prefill_ms": pre}
                for m, v in res["idle_ttft_ms"].items()
            ],
            ["mode", "idle_ttft_ms", "server_ttft_ms", "prefill_ms"],
        )
    if checks:
        print_table(checks, ["check", "value", "target", "met"])


def _terminated(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # a timeout's SIGTERM still runs the finally blocks (the server stops)


def main() -> None:
    ap = model_args(argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))
    ap.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--contexts", type=int, nargs="+", default=[2048, 20480])
    ap.add_argument("--decode-tokens", type=int, default=64, help="counted tokens per request (after all first tokens)")
    ap.add_argument(
        "--max-tokens", type=int, default=0,
        help="max_tokens of a row's requests (0: enough that the first admitted still decode when the last starts)",
    )  # fmt: skip
    ap.add_argument("--runner-warmup", type=int, default=3, help="runner steps before the timed ones")
    ap.add_argument("--seg-len", type=int, default=1024, help="tokens per document")
    ap.add_argument("--query-len", type=int, default=50, help="query characters (tokens), at most context / 8")
    ap.add_argument("--ttft-reps", type=int, default=5, help="repeats of the first request (steady TTFT)")
    ap.add_argument("--ttft-context", type=int, default=0, help="prompt tokens of the first request (0: --contexts[0])")
    ap.add_argument("--ttft-mode", default="full_recompute", help="mode of the first request and its repeats")
    ap.add_argument("--idle-modes", nargs="+", default=["full_recompute", "prefix_cache", "hypic"])
    ap.add_argument("--idle-warmup", type=int, default=3)
    ap.add_argument("--idle-reps", type=int, default=5)
    ap.add_argument("--prefill-reps", type=int, default=5)
    ap.add_argument("--kv-pool-tokens", type=int, default=0, help="HYPIC_KV_POOL_TOKENS (0: the largest row's need)")
    ap.add_argument("--row-timeout-s", type=float, default=300)
    ap.add_argument("--child-timeout-s", type=float, default=1200)
    ap.add_argument("--start-timeout-s", type=float, default=600)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench_out/serving.json")
    args = ap.parse_args()
    if args.decode_tokens < 2:
        ap.error("--decode-tokens must be >= 2")
    signal.signal(signal.SIGTERM, _terminated)
    # one Triton cache (kernels and autotune results) for the child and the server, inherited by both:
    # the server would otherwise keep its own under its throw-away HYPIC_HOME (warm_start.py)
    os.environ.setdefault("TRITON_CACHE_DIR", str(Path.home() / ".triton" / "cache"))
    os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")
    defaults = Settings()
    max_b, max_ctx = max(args.batches), max(args.contexts)
    auto = args.decode_tokens + 2 * max_b * -(-max_ctx // defaults.prefill_chunk_tokens) + 64
    max_tokens = min(args.max_tokens or auto, defaults.max_tokens_limit)
    page = defaults.kv_page_size
    kv_tokens = args.kv_pool_tokens or max_b * (-(-(max_ctx + max_tokens) // page) + 1) * page + 4 * page
    home = Path(tempfile.mkdtemp(prefix="hypic-serving-"))
    cfg = home / "config.json"
    cfg.write_text(json.dumps(load_shape(args.shape, args.layers)))
    env = {
        "HYPIC_MODEL": f"random:{cfg}",
        "HYPIC_DEVICE": args.device,
        "HYPIC_DTYPE": args.dtype,
        "HYPIC_SEED": "0",
        "HYPIC_MAX_CONTEXT": str(max_ctx + max_tokens + 64),
        "HYPIC_MAX_RUNNING": str(max_b),
        "HYPIC_KV_POOL_TOKENS": str(kv_tokens),
    }
    print(f"max_tokens {max_tokens}, KV pool {kv_tokens} tokens, settings {env}", flush=True)
    res: dict[str, Any] = {
        "args": vars(args),
        "rows": [],
        "prefill_ms": {},
        "idle_ttft_ms": {},
        "idle_ttft_all_ms": {},
        "idle_server_ttft_ms": {},
        "idle_usage": {},
        "max_tokens": max_tokens,
        "kv_pool_tokens": kv_tokens,
        "triton_cache_dir": os.environ["TRITON_CACHE_DIR"],
    }
    out = Path(args.out)
    try:
        if {"runner", "scheduler"} & set(args.paths):
            child = run_inprocess(args, {**env, "HYPIC_HOME": str(home / "inprocess")}, max_tokens)
            res["rows"] += child["rows"]
            res["prefill_ms"], res["device"] = child["prefill_ms"], child["device"]
            write_json(out, {**res, "partial": True})
        if "http" in args.paths:
            env_srv = {**env, "HYPIC_HOME": str(home / "server")}
            log = out.with_name(out.stem + ".server.log")
            with ServeProcess(env_srv, log, start_timeout_s=args.start_timeout_s) as srv:
                res["startup_s"], res["startup_stages"] = srv.startup_s, srv.stages
                print(f"server listening at {srv.url} {srv.startup_s:.1f} s after the spawn", flush=True)
                asyncio.run(http_phase(args, srv.url, max_tokens, res))
            res["server_log"] = str(log)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    if "device" not in res:  # no child ran: ask here, the server being gone
        res["device"] = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    report(res, args)
    write_json(out, res)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
