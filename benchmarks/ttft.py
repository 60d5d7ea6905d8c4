"""TTFT of every mode on a RAG workload, side by side in one run, as a user meets it: each request
goes through the scheduler (``Serving``: admission, the step's one forward, sampling) alone, and its
TTFT is from submit to its first token.

Each request: ``--segments`` documents of ``--seg-len`` tokens drawn in random order from a pool,
plus a ``--query-len``-token question. ``--hit-rate 1.0`` = warm (all documents cached before);
0.8 = 80% of each request's documents cached, the rest never seen before.

    python benchmarks/ttft.py --shape qwen3_5_35b_a3b --requests 8 --hit-rates 1.0 0.8
    python benchmarks/ttft.py --shape tiny:qwen3_5_text --device cpu --seg-len 64 --segments 6 --requests 3

A mode may set knobs after an ``@`` for an A/B in one run: each mode's engine gets its own
``Settings`` (CUDA graphs are recaptured per mode), the knobs it names on top of the defaults.
Kernel choices (``Settings.kernels``, ``HYPIC_KERNELS__<FIELD>``): ``hypic@precise_for_half=true``
(``combine_scan``: the token-loop scan), ``hypic@moe_slots=4096,moe_bm=64``
(``moe_triton_max_slots`` / ``moe_triton_block_m``), ``hypic@bucket_step=512``
(``graph_bucket_step``: the layer graphs' token buckets above 2,048), or any other
``KernelSettings`` field by its name (``hypic@precise_for_half=true``,
``hypic@precompose_leading_bodies=false``); other settings: ``hypic@graph_after=0``
(``combine_graph_after``: combine graphs off), ``hypic@cold_after=0`` (``cold_graph_after``:
cold-core graphs off).
"""

from __future__ import annotations

import argparse
import gc
import random
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from _common import NoText, gpu_busy_ms, host_syncs, load_shape, model_args, print_table, random_model, sync, write_json

from hypic_agent.config import MODES, Settings
from hypic_agent.config_kernels import KernelSettings
from hypic_agent.runtime.engine import Engine
from hypic_agent.runtime.results import FinishEvent
from hypic_agent.runtime.sampling import SamplingParams
from hypic_agent.runtime.scheduler.request import GenerationRequest
from hypic_agent.runtime.serving import Serving


@dataclass
class Seg:
    token_ids: tuple[int, ...]
    kind: str = "document"


@dataclass
class Plan:
    segments: list[Seg]
    suffix_ids: list[int]
    bos_id: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def make_requests(
    args: argparse.Namespace, vocab: int, hit_rate: float, extra: int = 0
) -> tuple[list[Plan], list[Seg]]:
    """``--warmup + --requests`` plans, then ``extra`` more of the same kind (their pool documents are
    cached too, their other documents new), and the pool documents to cache."""
    rng = random.Random(args.seed)
    n_cold = round(args.segments * (1 - hit_rate))
    pool = [Seg(tuple(rng.randrange(vocab) for _ in range(args.seg_len))) for _ in range(args.pool)]
    plans, warm = [], set()
    for _ in range(args.requests + args.warmup + extra):
        docs = rng.sample(range(args.pool), args.segments - n_cold)
        warm.update(docs)
        segs = [pool[i] for i in docs]
        segs += [Seg(tuple(rng.randrange(vocab) for _ in range(args.seg_len))) for _ in range(n_cold)]
        rng.shuffle(segs)
        plans.append(Plan(segs, [rng.randrange(vocab) for _ in range(args.query_len)]))
    return plans, [pool[i] for i in sorted(warm)]


def first_token(serving: Serving, plan: Plan, mode: str, seam: float) -> FinishEvent:
    """One request alone through the scheduler, to its first (and only) token."""
    req = GenerationRequest(plan, SamplingParams(max_tokens=1, ignore_eos=True), mode, seam)
    return next(ev for ev in serving.scheduler.submit(req).events() if isinstance(ev, FinishEvent))


def sync_audit(serving: Serving, plan: Plan, mode: str, seam: float, top: int = 20) -> dict[str, Any]:
    """One request under ``torch.cuda.set_sync_debug_mode("warn")``: its TTFT and its host<->device
    synchronisations per ``file:line`` (on the scheduler's thread too: the warning filter is process-wide)."""
    if not torch.cuda.is_available():
        return {}
    sync()
    fin, lines = host_syncs(partial(first_token, serving, plan, mode, seam))
    n = sum(lines.values())
    print(f"  {mode}: {n} host syncs in one request ({fin.ttft_ms:.1f} ms under the audit)")
    for line, c in lines.most_common(8):
        print(f"    {c:5d}  {line}")
    return {"audit_ttft_ms": fin.ttft_ms, "audit_syncs": n, "audit_syncs_by_line": lines.most_common(top)}


def _device_allocs(device: str) -> tuple[int, int, int]:
    """The caching allocator's cudaMalloc, cudaFree and out-of-memory-retry counts so far."""
    if not device.startswith("cuda"):
        return (0, 0, 0)
    st = torch.cuda.memory_stats()
    return (st.get("num_device_alloc", 0), st.get("num_device_free", 0), st.get("num_alloc_retries", 0))


def _memory(device: str) -> dict[str, float]:
    if not device.startswith("cuda"):
        return {}
    free, total = torch.cuda.mem_get_info()
    st = torch.cuda.memory_stats()
    gib = 1 << 30
    out = {"free_gib": free / gib, "total_gib": total / gib}
    for name, key in (("allocated", "current"), ("peak", "peak")):
        out[f"{name}_gib"] = st[f"allocated_bytes.all.{key}"] / gib
    out["reserved_gib"] = st["reserved_bytes.all.current"] / gib
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


# knob -> KernelSettings field (every field also answers to its own name)
KNOBS = {"moe_slots": "moe_triton_max_slots", "moe_bm": "moe_triton_block_m",
         "bucket_step": "graph_bucket_step"}  # fmt: skip
SETTING_KNOBS = {"graph_after": "combine_graph_after", "cold_after": "cold_graph_after"}  # Settings fields


def set_knobs(spec: str, settings: Settings) -> Settings:
    """``"precise_for_half=true,moe_bm=64,graph_after=0"`` -> a copy of ``settings`` with those knobs (the kernel
    choices validated as ``KernelSettings``; every other value as in ``settings``)."""
    given = dict(kv.split("=", 1) for kv in spec.split(",") if kv)
    kernel_knobs = {**KNOBS, **{f: f for f in KernelSettings.model_fields}}
    if unknown := set(given) - set(kernel_knobs) - set(SETTING_KNOBS):
        raise SystemExit(f"unknown knobs {sorted(unknown)}; use {sorted({*kernel_knobs, *SETTING_KNOBS})}")
    chosen = {kernel_knobs[k]: v for k, v in given.items() if k in kernel_knobs}
    try:
        kernels = KernelSettings.model_validate({**settings.kernels.model_dump(), **chosen})
    except ValueError as err:
        raise SystemExit(f"bad kernel knobs {spec!r}: {err}") from err
    update: dict[str, Any] = {SETTING_KNOBS[k]: int(v) for k, v in given.items() if k in SETTING_KNOBS}
    return settings.model_copy(update={**update, "kernels": kernels})


def main() -> None:
    ap = model_args(argparse.ArgumentParser(description=__doc__))
    ap.add_argument("--pool", type=int, default=200)
    ap.add_argument("--segments", type=int, default=20)
    ap.add_argument("--seg-len", type=int, default=1024)
    ap.add_argument("--query-len", type=int, default=50)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seam", type=float, default=8)
    ap.add_argument("--hit-rates", type=float, nargs="+", default=[1.0, 0.8])
    ap.add_argument("--modes", nargs="+", default=list(MODES), help="modes, each optionally @knob=value,...")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--sync-audit",
        action="store_true",
        help="CUDA: one more request per mode and hit rate, of the same kind as the timed ones (a new order, new "
        "documents where the hit rate is below 1), under torch.cuda.set_sync_debug_mode: its host<->device syncs "
        "counted per file:line in the JSON",
    )
    ap.add_argument("--out", default="bench_out/ttft.json")
    args = ap.parse_args()
    model = random_model(load_shape(args.shape, args.layers), args.device, getattr(torch, args.dtype))
    max_context = args.segments * args.seg_len + args.query_len + 64
    settings = Settings(min_cached_tokens=16, cpu_budget_bytes=1 << 40, max_context=max_context, max_running=8)
    rows = []
    for hit in args.hit_rates:
        plans, warm_docs = make_requests(args, model.config.vocab_size, hit, extra=int(args.sync_audit))
        audit_plan = plans.pop() if args.sync_audit else None
        for label in args.modes:
            mode, _, knobs = label.partition("@")
            mode_settings = set_knobs(knobs, settings)
            # fresh caches per mode, and fresh CUDA graphs (``engine.runner.graphs``): recaptured per mode
            # on the knobs' paths
            engine = Engine(model, None, "bench", mode_settings)
            engine.tokenizer = NoText()
            serving = Serving.of(engine)
            if mode not in ("full_recompute", "prefix_cache"):
                for i in range(0, len(warm_docs), 16):
                    chunk = warm_docs[i : i + 16]
                    engine.prewarm([s.token_ids for s in chunk], [s.kind for s in chunk], mode=mode, seam=args.seam)
            gc.collect()  # the previous modes' engines: free their memory now, not inside a timed request
            allocs = _device_allocs(args.device)
            times = []
            for j, plan in enumerate(plans):
                sync()
                fin = first_token(serving, plan, mode, args.seam)
                prep = fin.prepared
                if j >= args.warmup:
                    times.append(fin.ttft_ms)
                    cached = prep.cached_tokens
            # GPU time of one more request (a warm one repeats the last plan; at < 100% hit its cold
            # segments are cached by now, so only warm requests get this column): steadier across
            # machines than the wall time, which the host can set
            allocs_after = _device_allocs(args.device)
            busy = gpu_busy_ms(partial(first_token, serving, plan, mode, args.seam)) if hit == 1.0 else 0.0
            audit = sync_audit(serving, audit_plan, mode, args.seam) if audit_plan is not None else {}
            rows.append(
                {
                    "hit_rate": hit,
                    "mode": label,
                    "p50_ms": pct(times, 0.5),
                    "gpu_busy_ms": busy,
                    "p90_ms": pct(times, 0.9),
                    "mean_ms": sum(times) / len(times),
                    "cached_tokens": cached,
                    "prompt_tokens": prep.prompt_tokens,
                    "timings": prep.timings_ms,
                    "times_ms": times,
                    # cudaMalloc / cudaFree / OOM-retry counts of the caching allocator during the requests
                    "device_allocs": [b - a for a, b in zip(allocs, allocs_after, strict=True)],
                    "memory": _memory(args.device),
                    # requests served by a CUDA graph of the whole combine forward (incl. the GPU-time one)
                    "combine_graph_replays": getattr(engine.runner.graphs.combines, "replays", 0),
                    "cold_graph_replays": getattr(engine.runner.graphs.colds, "replays", 0),
                    **audit,
                }
            )
            print(f"hit={hit} {label}: p50 {rows[-1]['p50_ms']:.1f} ms", flush=True)
            write_json(args.out, {"args": vars(args), "rows": rows, "partial": True})
            serving.close()
            del serving, engine
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()
        base = next((r for r in rows if r["hit_rate"] == hit and r["mode"] == "prefix_cache"), None)
        for r in rows:
            if base and r["hit_rate"] == hit:
                r["speedup_vs_prefix_cache_p50"] = base["p50_ms"] / r["p50_ms"]
    cols = ["hit_rate", "mode", "p50_ms", "p90_ms", "gpu_busy_ms", "cached_tokens", "prompt_tokens"]
    print_table(rows, [*cols, "speedup_vs_prefix_cache_p50"])
    write_json(
        args.out,
        {
            "args": vars(args),
            "rows": rows,
            "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        },
    )


if __name__ == "__main__":
    main()
