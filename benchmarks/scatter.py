"""Scatter workers: cold TTFT of a request on 1, 2, 4 worker processes, LPT vs round-robin.

    python benchmarks/scatter.py --model tiny:qwen3_5_text --device cpu --workers 1 2 4
    python benchmarks/scatter.py --workers 1 2 --doc 4000 --split 500 --stream-layers 0 1
    python benchmarks/scatter.py --model random:benchmarks/configs/qwen3_5_35b_a3b.json --device cuda \
        --workers 1 2 4 8 --lengths $(printf '1024 %.0s' {1..32})   # a multi-GPU host, one worker per GPU

* The request: ``--lengths`` cold segments (default skewed: two long documents among short ones, in
  an order that round-robin deals both long ones to one worker), or with ``--doc T`` one document of
  T tokens; plus a short question, prepared in ``hypic`` mode under a fresh tenant each repetition,
  so every segment is cold: the time is the whole ``Engine.prepare`` (lookup, building the cold
  segments, combine), i.e. the cold TTFT without sampling: the median and the best of ``--reps``
  after a warm-up (the best is the least disturbed by other load on a shared machine).
* ``--split N``: ``Settings.split_segment_tokens = N``, the document(s) cut into N-token pieces,
  each a cold build of its own (so one long document is built on several workers); a row of one
  worker without the split is added, the whole document as one build.
* 1 worker is the in-process path (cold segments built inside the combine forward); N > 1 starts a
  ``WorkerPool`` of N processes (gloo on CPU, NCCL on CUDA), and both policies run on the same
  pool (``lpt``: LPT on the fitted cost model; ``round_robin``), once per ``--stream-layers`` value
  (layers per message as a worker streams entries back; 0 = whole entries after the build).
* transfer: per entry, rank 0's time receiving it (each layer group's header to its last byte,
  summed; median); exposed: per job, rank 0's wall time not covered by the worker's build (job out,
  transfer left after the last layer, assembly; median): what streaming by layer groups hides.
* the start-up of the pool (spawn, model load, rendezvous) is reported, not counted in TTFT.
* ``--threads``: rank 0's intra-op threads (default 1, as each worker has): on a shared CPU more
  threads than free cores make the in-process rows swing by 2-4x between runs.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time
from typing import Any

import torch
from _common import print_table, write_json
from ttft import Plan, Seg  # the request shapes ttft.py measures

from hypic_agent.config import Settings
from hypic_agent.runtime.engine import Engine
from hypic_agent.runtime.loader import load_engine
from hypic_agent.runtime.workers.pool import WorkerPool


def cold_ttft_ms(engine: Engine, plan: Plan, reps: int, tag: str) -> tuple[float, float]:
    """Median and best of ``reps`` cold prepares (the best: least disturbed on a shared machine)."""
    engine.prepare(plan, mode="hypic", tenant=f"{tag}-warmup")
    pool = engine.scatter_pool
    if pool is not None:  # the warm-up's transfers (first sends, allocator growth) are not counted
        pool.stats.transfer_ms.clear()
        pool.stats.exposed_ms.clear()
    times = []
    for r in range(reps):
        t0 = time.perf_counter()
        engine.prepare(plan, mode="hypic", tenant=f"{tag}-{r}")  # a new tenant: every segment is cold
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), min(times)


def pool_row(pool: WorkerPool) -> dict[str, Any]:
    s = pool.stats
    return {
        "transfer_ms_per_entry": statistics.median(s.transfer_ms) if s.transfer_ms else float("nan"),
        "exposed_ms_per_job": statistics.median(s.exposed_ms) if s.exposed_ms else float("nan"),
        "failures": s.failures,
    }


def measure(settings: Settings, plan: Plan, args: argparse.Namespace, split: int) -> list[dict[str, Any]]:
    """Rows for one engine: in-process, or per policy and stream group size on its pool."""
    n = settings.scatter_workers
    t0 = time.perf_counter()
    engine = load_engine(settings)
    start_s = time.perf_counter() - t0
    rows: list[dict[str, Any]] = []
    try:
        pieces = len(engine.pieces(plan, mode="hypic").segs)
        pool = engine.scatter_pool
        runs = [(p, k) for p in ("lpt", "round_robin") for k in args.stream_layers] if pool else [("in-process", 0)]
        for policy, k in runs:
            if pool is not None:
                pool.policy, pool.stream_layers = policy, k
            ms, best = cold_ttft_ms(engine, plan, args.reps, f"w{n}-s{split}-{policy}-{k}")
            row: dict[str, Any] = {"workers": n, "policy": policy, "split": split, "pieces": pieces}
            row |= {"cold_ttft_ms": ms, "cold_ttft_min_ms": best}
            if pool is not None:
                row |= {"stream_layers": k, "start_s": start_s, **pool_row(pool)}
            rows.append(row)
            print(f"workers {n} {policy} split {split} stream {k}: {ms:.1f} ms", flush=True)
    finally:
        engine.close()
        del engine  # the next configuration loads its own replica: free this one's device memory first
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny:qwen3_5_text", help="a model spec the workers can load too")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 128, 128, 128, 1024, 128, 128, 128])
    ap.add_argument("--doc", type=int, default=0, help="one document of this many tokens instead of --lengths")
    ap.add_argument("--split", type=int, default=0, help="Settings.split_segment_tokens (0: no split)")
    ap.add_argument("--stream-layers", type=int, nargs="+", default=[Settings().scatter_stream_layers])
    ap.add_argument("--threads", type=int, default=1, help="rank 0's torch intra-op threads (workers: 1)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default="bench_out/scatter.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    lengths = [args.doc] if args.doc else args.lengths
    plan = Plan([Seg(tuple(torch.randint(0, 256, (n,), generator=g).tolist())) for n in lengths], list(range(1, 9)))
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as home:
        # the context window covers the request (32 x 1k segments plus the question pass the default 32k)
        window = max(Settings().max_context, sum(lengths) + len(plan.suffix_ids) + 64)
        common = {"model": args.model, "device": args.device, "home": home, "min_cached_tokens": 4}
        common["max_context"] = window
        if args.split:  # the baseline: the whole document(s), one build each, in process
            rows += measure(Settings(**common, split_segment_tokens=0), plan, args, 0)
        for n in args.workers:
            settings = Settings(**common, scatter_workers=n, split_segment_tokens=args.split)
            rows += measure(settings, plan, args, args.split)
    base = next((r["cold_ttft_ms"] for r in rows if r["workers"] == 1 and r["split"] == args.split), float("nan"))
    for r in rows:
        r["speedup_vs_1"] = base / r["cold_ttft_ms"]
    cols = ["workers", "policy", "split", "pieces", "stream_layers", "cold_ttft_ms", "cold_ttft_min_ms", "speedup_vs_1"]
    print_table(rows, [*cols, "transfer_ms_per_entry", "exposed_ms_per_job", "start_s", "failures"])
    write_json(
        args.out,
        {
            "model": args.model,
            "device": args.device,
            "lengths": lengths,
            "split": args.split,
            "stream_layers": args.stream_layers,
            "reps": args.reps,
            "threads": args.threads,
            "cpus": os.cpu_count(),
            "date": time.strftime("%Y-%m-%d"),
            "torch": torch.__version__,
            "rows": rows,
            "note": "gloo on CPU" if args.device == "cpu" else "NCCL: one worker per GPU",
        },
    )


if __name__ == "__main__":
    main()
