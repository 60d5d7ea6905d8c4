"""Where prefill time goes: torch.profiler top CUDA kernels for ours vs transformers, and chain-scan variants.

python benchmarks/prefill_profile.py --shape qwen3_5_35b_a3b --layers 4 --length 8192
python benchmarks/prefill_profile.py --shape qwen3_5_35b_a3b --layers 8 --combine-only
"""

from __future__ import annotations

import argparse

import torch
from _common import host_syncs, load_shape, model_args, random_model, timed, write_json
from prefill import hf_twin

from hypic_agent.kernels import chain as chain_ops
from hypic_agent.runtime.runner.standalone import prefill


def top_kernels(fn, n: int = 18, host: bool = False) -> list[dict]:
    """Top CUDA kernels of one warm call; ``host=True`` also lists the CUDA runtime calls (launches,
    synchronisations, copies) with their host time, which shows a launch- or sync-bound call."""
    fn()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CUDA] + ([torch.profiler.ProfilerActivity.CPU] if host else [])
    with torch.profiler.profile(activities=acts) as prof:
        fn()
        torch.cuda.synchronize()
    if host:
        runtime = [e for e in prof.key_averages() if e.key.startswith("cuda") or e.key.startswith("cu")]
        print("host side, CUDA runtime calls:")
        for e in sorted(runtime, key=lambda e: -e.cpu_time_total)[:8]:
            print(f"  {e.cpu_time_total / 1e3:8.2f} ms  {e.count:6d}x  {e.key[:70]}")
        ops = [e for e in prof.key_averages() if e.key.startswith("aten::")]
        print(f"aten ops: {sum(e.count for e in ops)} calls; top by host self time:")
        for e in sorted(ops, key=lambda e: -e.self_cpu_time_total)[:10]:
            print(f"  {e.self_cpu_time_total / 1e3:8.2f} ms  {e.count:6d}x  {e.key[:70]}")
    rows = []
    for e in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:n]:
        rows.append({"name": e.key[:90], "cuda_ms": e.device_time_total / 1e3, "calls": e.count})
    total = sum(e.device_time_total for e in prof.key_averages()) / 1e3
    print(f"total CUDA kernel time {total:.1f} ms")
    for r in rows:
        print(f"  {r['cuda_ms']:8.2f} ms  {r['calls']:5d}x  {r['name']}")
    return rows


def host_audit(fn, n: int = 30) -> dict:
    """Where a warm call's host work comes from: top-level aten ops counted per innermost
    hypic_agent (or fla) function that issued them, and every host<->device synchronisation with the line
    that caused it (``torch.cuda.set_sync_debug_mode``)."""
    import collections

    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_stack=True) as prof:
        fn()
        torch.cuda.synchronize()
    per_line: collections.Counter[str] = collections.Counter()
    for e in prof.events():  # python frames are the aten events' ancestors (with_stack)
        if not e.name.startswith("aten::"):
            continue
        p, key, nested = e.cpu_parent, None, False
        while p is not None:
            if p.name.startswith("aten::"):
                nested = True
                break
            if key is None and ("hypic_agent/" in p.name or "/fla/" in p.name):
                key = p.name.split("/")[-1]
            p = p.cpu_parent
        if not nested:
            per_line[key or "?"] += 1
    print(f"top-level aten ops: {sum(per_line.values())}; by issuing line:")
    for line, c in per_line.most_common(n):
        print(f"  {c:5d}  {line}")
    _, syncs = host_syncs(fn)
    print(f"host syncs: {sum(syncs.values())}")
    for line, c in syncs.most_common(n):
        print(f"  {c:5d}  {line}")
    return {"aten_by_line": per_line.most_common(n), "syncs_by_line": syncs.most_common(n)}


def main() -> None:
    ap = model_args(argparse.ArgumentParser(description=__doc__), layers=4)
    ap.add_argument("--length", type=int, default=8192)
    ap.add_argument("--seg-len", type=int, default=1024, help="segment length for the combine profile")
    ap.add_argument("--out", default="bench_out/profile.json")
    ap.add_argument("--combine-only", action="store_true", help="skip the prefill and chain profiles")
    ap.add_argument("--scatter", action="store_true", help="also profile entry building of 4 cold segments")
    args = ap.parse_args()
    raw = load_shape(args.shape, args.layers)
    model = random_model(raw, args.device, getattr(torch, args.dtype))
    if args.combine_only:
        print("== hypic combine (warm, 20 x 1k segments + 50-token query)")
        out = {"combine": profile_combine(model, args.seg_len)}
        if args.scatter:
            out["scatter"] = profile_scatter(model, args.seg_len)
        write_json(args.out, out)
        return
    hf = hf_twin(model, raw, args.device)
    ids = torch.randint(0, model.config.vocab_size, (args.length,)).tolist()
    x = torch.tensor([ids], device=args.device)
    print("== ours")
    ours = top_kernels(lambda: prefill(model, [ids]))
    print("== transformers")
    with torch.no_grad():
        theirs = top_kernels(lambda: hf(input_ids=x, logits_to_keep=1, use_cache=False))
    # chain variants: 41 pairs (20 segments: 21 pieces + 20 bodies) at the real GDN state shape
    cfg = model.config
    hv, k, v = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
    T = torch.randn(41, hv, k, k, device="cuda") * 0.05
    S = torch.randn(41, hv, k, v, device="cuda")
    h0 = torch.zeros(hv, k, v, device="cuda")
    ref = chain_ops.chain_scan_torch(h0, T, S)
    chain = {}
    for name, fn in {
        "torch_loop": lambda: chain_ops.chain_scan_torch(h0, T, S),
        "triton": lambda: chain_ops.chain_scan(h0, T, S, backend="fla"),
    }.items():
        t, _ = timed(fn, reps=10, warmup=3)
        err = ((fn() - ref).norm() / ref.norm()).item()
        chain[name] = {"ms": t * 1e3, "rel_err_vs_torch": err}
        print(f"chain {name}: {t * 1e3:.3f} ms, rel err {err:.2e}")
    print("== hypic combine (warm, 20 x 1k segments + 50-token query)")
    combine_rows = profile_combine(model, args.seg_len)
    write_json(args.out, {"ours": ours, "transformers": theirs, "chain": chain, "combine": combine_rows})


def profile_combine(model, seg_len: int, n_segments: int = 20) -> dict:
    """Warm HYPIC TTFT split into engine stages, plus its top CUDA kernels and Python hot spots."""
    import cProfile
    import io
    import pstats

    from ttft import Plan, Seg

    from hypic_agent.config import Settings
    from hypic_agent.runtime.engine import Engine

    g = torch.Generator().manual_seed(0)
    segs = [
        Seg(tuple(torch.randint(0, model.config.vocab_size, (seg_len,), generator=g).tolist()))
        for _ in range(n_segments)
    ]
    plan = Plan(segs, torch.randint(0, model.config.vocab_size, (50,), generator=g).tolist())
    engine = Engine(model, None, "profile", Settings(min_cached_tokens=16, cpu_budget_bytes=1 << 40))
    engine.prepare(plan, mode="hypic")  # builds entries and compiles
    prep = engine.prepare(plan, mode="hypic")
    print("stage ms:", {k: round(v, 1) for k, v in prep.timings_ms.items()})
    kernels = top_kernels(lambda: engine.prepare(plan, mode="hypic"), n=25, host=True)
    audit = host_audit(lambda: engine.prepare(plan, mode="hypic"))
    prof = cProfile.Profile()
    prof.enable()
    engine.prepare(plan, mode="hypic")
    torch.cuda.synchronize()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(25)
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(20)
    print(buf.getvalue())
    return {"stages_ms": prep.timings_ms, "kernels": kernels, "audit": audit, "python": buf.getvalue()}


def profile_scatter(model, seg_len: int, n_segments: int = 4) -> dict:
    """Entry building of ``n_segments`` cold segments (the 80%-hit TTFT's scatter stage) against a plain
    packed prefill of the same tokens: wall times, then top kernels and host calls of the build."""
    import cProfile
    import io
    import pstats

    from hypic_agent.runtime.hypic.build import build_entries

    g = torch.Generator().manual_seed(1)
    segs = [torch.randint(0, model.config.vocab_size, (seg_len,), generator=g).tolist() for _ in range(n_segments)]
    times = {}
    for name, fn in {
        "prefill": lambda: prefill(model, segs),
        "build_w0": lambda: build_entries(model, segs, [0] * n_segments),
        "build_w8": lambda: build_entries(model, segs, [8] * n_segments),
    }.items():
        t, _ = timed(fn, reps=3, warmup=1)
        times[name] = t * 1e3
    print("scatter ms:", {k: round(v, 1) for k, v in times.items()})
    kernels = top_kernels(lambda: build_entries(model, segs, [8] * n_segments), n=20, host=True)
    audit = host_audit(lambda: build_entries(model, segs, [8] * n_segments))
    prof = cProfile.Profile()
    prof.enable()
    build_entries(model, segs, [8] * n_segments)
    torch.cuda.synchronize()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(30)
    print(buf.getvalue())
    return {"ms": times, "kernels": kernels, "audit": audit, "python": buf.getvalue()}


if __name__ == "__main__":
    main()
