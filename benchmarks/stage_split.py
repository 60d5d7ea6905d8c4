"""Wall vs host vs GPU-busy time of the runtime's main calls on one model: shows which are host-bound.

For each call (warm): median wall time (synchronized), host time until the call returns, and the
GPU-busy time (union of kernel intervals in one ``torch.profiler`` trace), kernel and launch
counts, and the top kernels. A call whose wall time is its host time while the GPU is busy for
much less is bound by Python and launch overhead.

    python benchmarks/stage_split.py --shape qwen3_5_35b_a3b            # all 40 layers, H200
    python benchmarks/stage_split.py --shape qwen3_5_35b_a3b --calls build combine
    python benchmarks/stage_split.py --shape qwen3_5_35b_a3b --calls combine_cold --gaps --sync-debug
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch
from _common import busy_ms, load_shape, model_args, print_table, random_model, write_json
from _gaps import gap_report, sync_report
from ttft import Plan, Seg

from hypic_agent.config import Settings
from hypic_agent.runtime.engine import Engine
from hypic_agent.runtime.hypic.build import build_entries
from hypic_agent.runtime.runner.standalone import prefill

CALLS = ("prefill_cold", "build", "prefill_prompt", "continuation", "combine", "combine_cold", "prefix_hit")


def host_profile(name: str, fn: Callable[[], Any], top: int = 22) -> None:
    """Python's profiler over one warm call: where the host time goes (a blocking CUDA call shows as
    the Python function that made it)."""
    import cProfile
    import pstats

    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    torch.cuda.synchronize()
    print(f"== host profile: {name}")
    pstats.Stats(prof).sort_stats("tottime").print_stats(top)
    pstats.Stats(prof).sort_stats("cumulative").print_stats(top)


DIAG: dict[str, Any] = {"gaps": False, "sync": False, "top": 14}  # --gaps / --sync-debug / --top


def measure(name: str, fn: Callable[[], Any], reps: int = 3, host: bool = False) -> dict[str, Any]:
    """Wall / host / GPU-busy ms of ``fn`` (median of ``reps`` warm calls) and its top kernels."""
    fn()
    torch.cuda.synchronize()
    if host or DIAG["gaps"] or DIAG["sync"]:
        fn()  # a first warm call may still capture CUDA graphs for new buckets
    if host:
        host_profile(name, fn)
    diag: dict[str, Any] = {}
    if DIAG["sync"]:
        print(f"== syncs: {name}")
        diag["syncs"] = sync_report(fn)
    if DIAG["gaps"]:
        print(f"== GPU idle: {name}")
        diag["idle"] = gap_report(fn)
    walls, hosts = [], []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - t0) * 1e3)
        hosts.append((t1 - t0) * 1e3)
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        fn()
        torch.cuda.synchronize()
    cuda = torch.autograd.DeviceType.CUDA
    kernels = [(e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type == cuda]
    avg = prof.key_averages()
    top = sorted((e for e in avg if e.device_type == cuda), key=lambda e: -e.self_device_time_total)[: DIAG["top"]]
    row = {
        "call": name,
        "wall_ms": sorted(walls)[reps // 2],
        "host_ms": sorted(hosts)[reps // 2],
        "gpu_busy_ms": busy_ms(kernels),
        "kernels": len(kernels),
        "launches": sum(e.count for e in avg if "LaunchKernel" in e.key or e.key.startswith("cuLaunch")),
        "graph_launches": sum(e.count for e in avg if e.key == "cudaGraphLaunch"),
        "top_kernels": [(e.key[:90], e.count, round(e.self_device_time_total / 1e3, 2)) for e in top],
        **diag,
    }
    print(f"{name}: wall {row['wall_ms']:.1f} ms, host {row['host_ms']:.1f} ms, GPU busy {row['gpu_busy_ms']:.1f} ms")
    return row


def main() -> None:
    ap = model_args(argparse.ArgumentParser(description=__doc__))
    ap.add_argument("--calls", nargs="+", default=list(CALLS), choices=CALLS)
    ap.add_argument("--cold", type=int, default=4, help="cold segments for prefill_cold / build")
    ap.add_argument("--segments", type=int, default=20)
    ap.add_argument("--seg-len", type=int, default=1024)
    ap.add_argument("--query-len", type=int, default=50)
    ap.add_argument("--host-profile", action="store_true", help="also print cProfile's top functions per call")
    ap.add_argument("--gaps", action="store_true", help="report GPU idle gaps and the host code in them")
    ap.add_argument("--sync-debug", action="store_true", help="report the call sites that sync with the GPU")
    ap.add_argument("--top", type=int, default=14, help="kernels (by GPU time) listed per call")
    ap.add_argument("--out", default="bench_out/stage_split.json")
    args = ap.parse_args()
    DIAG.update(gaps=args.gaps, sync=args.sync_debug, top=args.top)
    if not args.device.startswith("cuda"):
        raise SystemExit("stage_split.py profiles CUDA kernels: run it on a GPU")
    model = random_model(load_shape(args.shape, args.layers), args.device, getattr(torch, args.dtype))
    engine = Engine(model, None, "stage-split", Settings(min_cached_tokens=16, cpu_budget_bytes=1 << 40))  # graphs on
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(1)

    def toks(n: int) -> list[int]:
        return torch.randint(0, vocab, (n,), generator=g).tolist()

    cold = [toks(args.seg_len) for _ in range(args.cold)]
    docs = [Seg(tuple(toks(args.seg_len))) for _ in range(args.segments)]
    prompt = [t for d in docs for t in d.token_ids]
    query = toks(args.query_len)
    plan = Plan(docs, query)
    rows = []
    for call in args.calls:
        if call == "prefill_cold":
            rows.append(measure(f"prefill {args.cold} x {args.seg_len}", lambda: prefill(model, cold)))
        elif call == "build":
            rows.append(
                measure(f"build {args.cold} x {args.seg_len}, w=8", lambda: build_entries(model, cold, [8] * len(cold)))
            )
        elif call == "prefill_prompt":
            rows.append(measure(f"prefill {len(prompt)} tokens", lambda: prefill(model, [prompt]), reps=2))
        elif call == "continuation":
            state = prefill(model, [prompt])[0]
            rows.append(
                measure(f"{len(query)} tokens after {len(prompt)}", lambda s=state: prefill(model, [query], [s]))
            )
        elif call == "combine":
            engine.prepare(plan, mode="hypic")  # builds the entries
            hp = args.host_profile
            rows.append(measure("warm hypic prepare", lambda: engine.prepare(plan, mode="hypic"), host=hp))
            # the same cached entries without seam windows: what the 8-token windows cost
            rows.append(measure("warm transition prepare", lambda: engine.prepare(plan, mode="transition"), host=hp))
        elif call == "combine_cold":  # 80% hit: each call brings --cold new documents among the cached ones
            engine.prepare(plan, mode="hypic")

            def partly_cold() -> None:
                new = [Seg(tuple(toks(args.seg_len))) for _ in range(args.cold)]
                engine.prepare(Plan(docs[: args.segments - args.cold] + new, query), mode="hypic")

            rows.append(measure(f"hypic prepare, {args.cold} cold", partly_cold, host=args.host_profile))
        elif call == "prefix_hit":  # the warm-up call stores the prefix: timed calls resume from it
            rows.append(
                measure(
                    "prefix_cache prepare (prefix hit)",
                    lambda: engine.prepare(Plan(docs[::-1], query), mode="prefix_cache"),
                    reps=1,
                )
            )
    print_table(rows, ["call", "wall_ms", "host_ms", "gpu_busy_ms", "kernels", "launches", "graph_launches"])
    write_json(args.out, {"args": vars(args), "rows": rows, "device": torch.cuda.get_device_name()})


if __name__ == "__main__":
    main()
