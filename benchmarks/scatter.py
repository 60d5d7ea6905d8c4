"""Scatter workers: cold TTFT of an N-segment request on 1, 2, 4 worker processes, LPT vs round-robin.

    python benchmarks/scatter.py --model tiny:qwen3_5_text --device cpu --workers 1 2 4

* A request of ``--lengths`` cold segments (default skewed: two long documents among short ones, in
  an order that round-robin deals both long ones to one worker) plus a short question, prepared in
  ``hypic`` mode under a fresh tenant each repetition, so every segment is cold: the time is the
  whole ``Engine.prepare`` (lookup, building the cold segments, combine), i.e. the cold TTFT
  without sampling.
* 1 worker is today's in-process path (cold segments built inside the combine forward); N > 1 starts
  a ``WorkerPool`` of N processes (gloo on CPU, NCCL on CUDA), and both policies run on the same
  pool (``lpt``: LPT on the fitted cost model; ``round_robin``).
* transfer: per entry, rank 0's time from its header to its last tensor (median), and the entry's bytes.
* the start-up of the pool (spawn, model load, rendezvous) is reported, not counted in TTFT.

Only CPU numbers exist so far (a tiny model on a shared 2-core machine, where more workers than cores
only add contention): the GPU numbers (NCCL, one worker per H200) are not measured yet.
"""

from __future__ import annotations

import argparse
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


def cold_ttft_ms(engine: Engine, plan: Plan, reps: int, tag: str) -> float:
    engine.prepare(plan, mode="hypic", tenant=f"{tag}-warmup")
    times = []
    for r in range(reps):
        t0 = time.perf_counter()
        engine.prepare(plan, mode="hypic", tenant=f"{tag}-{r}")  # a new tenant: every segment is cold
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny:qwen3_5_text", help="a model spec the workers can load too")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 128, 128, 128, 1024, 128, 128, 128])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default="bench_out/scatter.json")
    args = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    plan = Plan(
        [Seg(tuple(torch.randint(0, 256, (n,), generator=g).tolist())) for n in args.lengths], list(range(1, 9))
    )
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as home:
        for n in args.workers:
            settings = Settings(model=args.model, device=args.device, home=home, scatter_workers=n, min_cached_tokens=4)
            t0 = time.perf_counter()
            engine = load_engine(settings)
            start_s = time.perf_counter() - t0
            try:
                pool = engine.scatter_pool
                for policy in ("lpt", "round_robin") if pool is not None else ("in-process",):
                    if pool is not None:
                        pool.policy = policy
                        pool.stats.transfer_ms.clear()
                    ms = cold_ttft_ms(engine, plan, args.reps, f"w{n}-{policy}")
                    row: dict[str, Any] = {"workers": n, "policy": policy, "cold_ttft_ms": ms, "start_s": start_s}
                    if pool is not None:
                        row["transfer_ms_per_entry"] = statistics.median(pool.stats.transfer_ms)
                        row["failures"] = pool.stats.failures
                    rows.append(row)
                    print(f"workers {n} {policy}: {ms:.1f} ms", flush=True)
            finally:
                engine.close()
    base = next((r["cold_ttft_ms"] for r in rows if r["workers"] == 1), float("nan"))
    for r in rows:
        r["speedup_vs_1"] = base / r["cold_ttft_ms"]
    print_table(
        rows, ["workers", "policy", "cold_ttft_ms", "speedup_vs_1", "transfer_ms_per_entry", "start_s", "failures"]
    )
    write_json(
        args.out,
        {
            "model": args.model,
            "device": args.device,
            "lengths": args.lengths,
            "reps": args.reps,
            "torch": torch.__version__,
            "rows": rows,
            "note": "CPU only; GPU (NCCL) numbers not measured yet",
        },
    )


if __name__ == "__main__":
    main()
