"""Serving throughput under an open-loop Poisson trace of RAG requests, per mode.

Each request: ``--segments`` documents of ``--seg-len`` tokens drawn without replacement from a pool
of ``--pool`` documents with Zipf(``--zipf``) popularity, in random order, plus a ``--query-len``
question and ``--max-tokens`` output tokens (EOS ignored). Requests arrive at Poisson times at each
offered load (requests/s) and go straight into the engine's scheduler (``Scheduler.submit``);
per load: p50/p90 TTFT, p50 TPOT, achieved QPS. The result per mode is the highest load whose p90
TTFT stays <= ``--sla`` s. A warm-up phase first runs ``--warm-requests`` requests so the store
holds the popular documents (as a long-running server's would).

    python benchmarks/qps.py --shape qwen3_5_35b_a3b --modes prefix_cache hypic --loads 1 2 4 8 16
    python benchmarks/qps.py --shape qwen3_5_35b_a3b --loads 8 16 20 24 \
        --mode-loads full_recompute=0.5,1,1.5,2 prefix_cache=0.5,1,1.5,2
    python benchmarks/qps.py --shape tiny:qwen3_5_text --device cpu --seg-len 32 --segments 4 --loads 2 4 --per-load 6
"""

from __future__ import annotations

import argparse
import collections
import gc
import random
import sys
import threading
import time
from typing import Any

import torch
from _common import NoText, kernel_summary, load_shape, model_args, print_table, random_model, write_json
from ttft import Plan, Seg  # the RAG request shapes ttft.py measures

from hypic_agent.config import Settings
from hypic_agent.runtime.engine import Engine
from hypic_agent.runtime.results import FinishEvent
from hypic_agent.runtime.sampling import SamplingParams
from hypic_agent.runtime.scheduler.request import GenerationRequest
from hypic_agent.runtime.serving import Serving
from hypic_agent.runtime.warm_start import warm_up


class Trace:
    def __init__(self, args: argparse.Namespace, vocab: int) -> None:
        self.rng = random.Random(args.seed)
        self.args = args
        self.vocab = vocab
        self.docs = [Seg(tuple(self.rng.randrange(vocab) for _ in range(args.seg_len))) for _ in range(args.pool)]
        self.weights = [1.0 / (i + 1) ** args.zipf for i in range(args.pool)]

    def request(self) -> Plan:
        chosen: set[int] = set()
        while len(chosen) < self.args.segments:
            chosen.add(self.rng.choices(range(self.args.pool), self.weights)[0])
        segs = [self.docs[i] for i in chosen]
        self.rng.shuffle(segs)
        return Plan(segs, [self.rng.randrange(self.vocab) for _ in range(self.args.query_len)])


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))] if xs else float("nan")


def run_load(serving: Serving, trace: Trace, mode: str, rate: float, n: int, max_tokens: int, seed: int) -> dict:
    rng = random.Random(seed)
    sampling = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    results: list[dict[str, float]] = []
    lock = threading.Lock()

    def consume(handle: Any, t_arr: float) -> None:
        first = None
        for ev in handle.events():
            if first is None:
                first = time.perf_counter()
            if isinstance(ev, FinishEvent):
                end = time.perf_counter()
                n_out = ev.completion_tokens
                tpot = (end - first) / max(n_out - 1, 1) * 1e3
                with lock:
                    results.append({"ttft_ms": (first - t_arr) * 1e3, "tpot_ms": tpot, "end": end})

    plans = [trace.request() for _ in range(n)]
    before = serving.scheduler.stats.as_dict()
    threads = []
    t_start = time.perf_counter()
    t_next = t_start
    for plan in plans:
        t_next += rng.expovariate(rate) if rate > 0 else 0.0  # rate 0: all at once (the warm-up)
        delay = t_next - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        t_arr = time.perf_counter()
        handle = serving.scheduler.submit(GenerationRequest(plan, sampling, mode, t0=t_arr))
        th = threading.Thread(target=consume, args=(handle, t_arr), daemon=True)
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    if not results:
        raise SystemExit(f"{mode} at {rate} QPS: every request failed (see the log)")
    span = max(r["end"] for r in results) - t_start
    after = serving.scheduler.stats.as_dict()
    ttft = [r["ttft_ms"] for r in results]
    return {
        "mode": mode,
        "offered_qps": rate,
        "achieved_qps": len(results) / span,
        "p50_ttft_ms": pct(ttft, 0.5),
        "p90_ttft_ms": pct(ttft, 0.9),
        "p50_tpot_ms": pct([r["tpot_ms"] for r in results], 0.5),
        "requests": len(results),
        **{k: round(after[k] - before[k], 1) for k in after},
    }


class StepProfile:
    """Per scheduler step: its rows (decodes, combines joined, cold tokens), wall time split into the
    HYPIC work's set-up (``StepWork.build``) and the forward, the caching allocator's retries, and the
    stage graphs captured meanwhile (``--profile``; wraps the scheduler's step and the graphs' capture)."""

    def __init__(self, serving: Serving) -> None:
        from hypic_agent.runtime.runner.stage_graphs import LayerGraphs
        from hypic_agent.runtime.scheduler.composed import StepWork

        self.steps: list[dict[str, float]] = []
        self.captures: list[float] = []
        sched, runner = serving.scheduler, serving.runner
        run, build, capture, forward = sched._run_step, StepWork.build, LayerGraphs._capture, runner.forward
        cur: dict[str, float] = {}
        cuda = torch.cuda.is_available()

        def retries() -> int:
            return torch.cuda.memory_stats().get("num_alloc_retries", 0) if cuda else 0

        def step() -> None:
            cur.clear()
            cur["decode"] = sum(1 for r in sched.live if r.decoding)
            r0, t0 = retries(), time.perf_counter()
            run()
            if cuda:
                torch.cuda.synchronize()
            cur["ms"] = (time.perf_counter() - t0) * 1e3
            cur["alloc_retries"] = retries() - r0
            if "joined" in cur or cur["decode"]:
                self.steps.append(dict(cur))

        def built(work: Any) -> Any:
            t0 = time.perf_counter()
            out = build(work)
            cur["joined"], cur["cold_tokens"] = len(work.joined), work.cold_tokens
            cur["build_ms"] = (time.perf_counter() - t0) * 1e3
            return out

        def forwarded(plan: Any) -> Any:
            t0 = time.perf_counter()
            out = forward(plan)
            if cuda:
                torch.cuda.synchronize()
            cur["forward_ms"], cur["rows"] = (time.perf_counter() - t0) * 1e3, plan.n_rows
            return out

        self.compiles: list[tuple[str, float]] = []  # Triton JIT compiles (or cache loads): kernel, ms
        try:
            from triton.runtime.jit import JITFunction

            do_compile = JITFunction._do_compile

            def compiled(fn: Any, *a: Any, **kw: Any) -> Any:
                t0 = time.perf_counter()
                out = do_compile(fn, *a, **kw)
                ms = (time.perf_counter() - t0) * 1e3
                self.compiles.append((fn.fn.__qualname__, ms))
                cur["compile_ms"] = cur.get("compile_ms", 0.0) + ms
                return out

            JITFunction._do_compile = compiled  # type: ignore[method-assign]
        except ImportError:
            pass

        def captured(graphs: Any, key: Any, fn: Any, parts: Any) -> Any:
            t0 = time.perf_counter()
            out = capture(graphs, key, fn, parts)
            self.captures.append((time.perf_counter() - t0) * 1e3)
            return out

        sched._run_step = step  # type: ignore[method-assign]
        runner.forward = forwarded  # type: ignore[method-assign]
        StepWork.build = built  # type: ignore[method-assign]
        LayerGraphs._capture = captured  # type: ignore[method-assign]

    def summary(self) -> dict[str, Any]:
        def agg(rows: list[dict[str, float]]) -> dict[str, float]:
            ms = sorted(r["ms"] for r in rows)
            return {"steps": len(rows), "p50_ms": pct(ms, 0.5), "p90_ms": pct(ms, 0.9), "max_ms": ms[-1] if ms else 0.0}

        decode_only = [r for r in self.steps if not r.get("joined") and not r.get("cold_tokens")]
        with_combines = [r for r in self.steps if r.get("joined")]
        cold_only = [r for r in self.steps if not r.get("joined") and r.get("cold_tokens")]
        return {
            "decode_only": agg(decode_only),
            "with_combines": agg(with_combines)
            | {"mean_joined": sum(r["joined"] for r in with_combines) / max(len(with_combines), 1)},
            "cold_only": agg(cold_only),
            "slowest": sorted(self.steps, key=lambda r: -r["ms"])[:6],
            "alloc_retries": sum(r.get("alloc_retries", 0) for r in self.steps),
            "stage_captures": len(self.captures),
            "stage_capture_ms": sum(self.captures),
            "compiles": len(self.compiles),
            "compile_ms": sum(ms for _, ms in self.compiles),
            "slowest_compiles": sorted(self.compiles, key=lambda c: -c[1])[:8],
        }


def sample_stacks(run: Any, every_s: float = 0.002) -> collections.Counter[str]:
    """Call ``run()`` while a thread samples every other thread's Python stack each ``every_s``; returns
    collapsed stacks (``file:function;...`` root first) -> samples: where the engine thread's host
    time goes (a sample lands where a thread holds or waits for the GIL)."""
    counts: collections.Counter[str] = collections.Counter()
    done = threading.Event()
    me = threading.get_ident()

    def sampler() -> None:
        own = threading.get_ident()
        while not done.is_set():
            for tid, frame in sys._current_frames().items():
                if tid in (me, own):
                    continue
                names = []
                f: Any = frame
                while f is not None:
                    names.append(f"{f.f_code.co_filename.rsplit('/', 1)[-1]}:{f.f_code.co_name}")
                    f = f.f_back
                counts[";".join(reversed(names))] += 1
            time.sleep(every_s)

    t = threading.Thread(target=sampler, daemon=True)
    t.start()
    try:
        run()
    finally:
        done.set()
        t.join()
    return counts


def burst(
    serving: Serving, trace: Trace, mode: str, n: int, max_tokens: int, profile: bool = False, spy: str = ""
) -> dict[str, Any]:
    """``n`` warm requests submitted together against one alone: the last first token vs one alone's
    TTFT (the same documents, so both are warm; each run is after the warm-up). ``profile``: the
    together run once more under ``torch.profiler`` (its kernels, GPU time against their span, and the
    scheduler's forwards and their wall time). ``spy``: a path: the together run 10 times more with every
    other thread's Python stack sampled (``sample_stacks``), collapsed stacks written there."""
    sampling = SamplingParams(max_tokens=max_tokens, ignore_eos=True)

    def ttfts(plans: list[Any]) -> list[float]:
        t0 = time.perf_counter()
        handles = [serving.scheduler.submit(GenerationRequest(p, sampling, mode, t0=t0)) for p in plans]
        out = []
        for h in handles:
            out += [ev.ttft_ms for ev in h.events() if isinstance(ev, FinishEvent)]
        return out

    plans = [trace.request() for _ in range(n)]
    ttfts(plans)  # every document cached, the layouts seen
    alone = sorted(ttfts([p])[0] for p in plans[:3])[1]  # median of three alone
    stats = serving.scheduler.stats
    s0 = dict(stats.as_dict())
    together = ttfts(plans)
    row: dict[str, Any] = {
        "mode": mode,
        "n": n,
        "alone_ttft_ms": alone,
        "last_ttft_ms": max(together),
        "ratio": max(together) / alone,
        # the together run's work: prepare items (combines joined + cold-build shares), cold rows built
        "combine_steps": stats.combine_steps - s0["combine_steps"],
        "cold_built_tokens": stats.cold_built_tokens - s0["cold_built_tokens"],
        "combine_step_ms": stats.combine_ms - s0["combine_ms"],
    }
    if spy:
        stacks = sample_stacks(lambda: [ttfts(plans) for _ in range(10)])
        with open(spy, "w") as f:
            f.writelines(f"{k} {v}\n" for k, v in stacks.most_common())
        row["spy"] = spy
    if profile:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        f0, c0 = stats.forwards, stats.combine_ms
        cuda = [ProfilerActivity.CUDA] if torch.cuda.is_available() else []
        with torch_profile(activities=[ProfilerActivity.CPU, *cuda]) as prof:
            again = ttfts(plans)
        row["profile"] = kernel_summary(prof) | {
            "last_ttft_ms": max(again),
            "forwards": stats.forwards - f0,
            "combine_step_ms": stats.combine_ms - c0,
        }
        print({k: v for k, v in row["profile"].items() if k != "top"}, flush=True)
    return row


def main() -> None:
    ap = model_args(argparse.ArgumentParser(description=__doc__))
    ap.add_argument("--modes", nargs="+", default=["full_recompute", "prefix_cache", "hypic"])
    ap.add_argument("--loads", type=float, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument(
        "--mode-loads",
        nargs="+",
        default=[],
        metavar="MODE=L1,L2",
        help="loads of one mode instead of --loads, e.g. full_recompute=0.5,1,1.5,2",
    )
    ap.add_argument("--per-load", type=int, default=0, help="requests per load level (0: 12 s worth, >= 12)")
    ap.add_argument("--warm-requests", type=int, default=20)
    ap.add_argument("--pool", type=int, default=200)
    ap.add_argument("--segments", type=int, default=20)
    ap.add_argument("--seg-len", type=int, default=1024)
    ap.add_argument("--query-len", type=int, default=50)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--zipf", type=float, default=1.0)
    ap.add_argument("--sla", type=float, default=1.0, help="p90 TTFT bound, seconds")
    ap.add_argument("--max-running", type=int, default=Settings().max_running, help="default: the server's")
    ap.add_argument("--chunk", type=int, default=8192, help="Settings.prefill_chunk_tokens")
    ap.add_argument("--entry-budget-gib", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--burst", type=int, default=8, help="warm requests submitted together (0: no burst row)")
    ap.add_argument(
        "--profile",
        action="store_true",
        help="per-step times by kind of work, stage-graph captures (each step timed to its end: overlap off)",
    )
    ap.add_argument(
        "--burst-profile", action="store_true", help="the burst once more under torch.profiler (its kernels, CUDA)"
    )
    ap.add_argument("--burst-spy", default="", help="a path: the burst's Python stacks sampled, written there")
    ap.add_argument("--no-overlap", action="store_true", help="Settings.overlap_schedule off")
    ap.add_argument("--no-warm-start", action="store_true", help="skip the server's warm start (runtime.warm_start)")
    ap.add_argument("--out", default="bench_out/qps.json")
    args = ap.parse_args()
    loads_of = {m: [float(x) for x in ls.split(",")] for m, ls in (a.split("=", 1) for a in args.mode_loads)}
    if unknown := set(loads_of) - set(args.modes):
        ap.error(f"--mode-loads names modes not in --modes: {sorted(unknown)}")
    dtype = getattr(torch, args.dtype)
    model = random_model(load_shape(args.shape, args.layers), args.device, dtype)
    rows: list[dict[str, Any]] = []
    bursts: list[dict[str, Any]] = []
    summary: dict[str, float] = {}
    for mode in args.modes:
        settings = Settings(
            max_running=args.max_running,
            overlap_schedule=not (args.no_overlap or args.profile),  # a profiled step is synchronized at its end
            prefill_chunk_tokens=args.chunk,
            cpu_budget_bytes=int(args.entry_budget_gib * (1 << 30)),
            kv_pool_fraction=0.5,
            max_context=args.segments * args.seg_len + args.query_len + args.max_tokens + 64,
        )
        engine = Engine(model, None, "qps-bench", settings)
        engine.tokenizer = NoText()
        serving = Serving.of(engine)
        if not args.no_warm_start:  # as `serve` does on a GPU before it listens (Settings.warm_start)
            w = warm_up(serving)
            print(
                {"warm_start_s": round(w.seconds, 1), "decode_buckets": w.decode_buckets, "prefills": w.prefill_tokens},
                flush=True,
            )
        prof = StepProfile(serving) if args.profile else None
        trace = Trace(args, model.config.vocab_size)
        run_load(serving, trace, mode, 0.0, args.warm_requests, args.max_tokens, args.seed)
        if args.burst:
            bursts.append(burst(serving, trace, mode, args.burst, args.max_tokens, args.burst_profile, args.burst_spy))
            print(bursts[-1], flush=True)
        if prof is not None:  # the warm-up's and burst's steps are not a load's
            print({"warm_up_compiles": len(prof.compiles), "compile_ms": sum(ms for _, ms in prof.compiles)})
            prof.steps.clear()
            prof.captures.clear()
            prof.compiles.clear()
        best = 0.0
        for rate in loads_of.get(mode, args.loads):
            n = args.per_load or max(12, round(rate * 12))
            row = run_load(serving, trace, mode, rate, n, args.max_tokens, args.seed + int(rate * 100))
            if prof is not None:
                row["profile"] = prof.summary()
                prof.steps.clear()
                prof.captures.clear()
                prof.compiles.clear()
            rows.append(row)
            print({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
            write_json(args.out, {"args": vars(args), "rows": rows, "burst": bursts, "partial": True})
            if row["p90_ttft_ms"] <= args.sla * 1e3:
                best = max(best, row["achieved_qps"])
            else:
                break
        summary[mode] = best
        serving.close()
        del serving, engine, trace
        gc.collect()  # the engine's pool, entry cache and prefix cache go before the next mode's
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    cols = ["mode", "offered_qps", "achieved_qps", "p50_ttft_ms", "p90_ttft_ms", "p50_tpot_ms", "requests"]
    print_table(rows, cols)
    if bursts:
        print_table(bursts, ["mode", "n", "alone_ttft_ms", "last_ttft_ms", "ratio"])
    base = summary.get("prefix_cache") or 0.0
    for mode, q in summary.items():
        ratio = f" ({q / base:.2f}x prefix_cache)" if base else ""
        print(f"{mode}: highest load with p90 TTFT <= {args.sla} s: {q:.2f} QPS{ratio}")
    dev = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    write_json(args.out, {"args": vars(args), "rows": rows, "burst": bursts, "qps_at_sla": summary, "device": dev})


if __name__ == "__main__":
    main()
