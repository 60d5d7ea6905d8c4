"""Decode speed of the serving core: ms per step and tokens/s at several batch sizes and contexts,
with the HBM floor beside each (weights + KV + linear states read once per step).

Each row: ``--batch`` sequences whose pool state holds ``--context`` tokens decode ``--steps``
steps through the scheduler's critical path (plan -> runner forward, replayed from a CUDA graph
per batch bucket -> device argmax -> one read-back of the ids; ``_common.decode_step_ms``). States
are the pool's zeros and every row is fed a different token each step (``_common.decode_tokens``):
the work and bytes moved are those of real requests of that length (an MoE's rows reach as many
experts as a served batch's do).

    python benchmarks/decode.py --shape qwen3_5_35b_a3b --batches 1 8 32 64 128 --contexts 2048 20480
    python benchmarks/decode.py --shape tiny:qwen3_5_text --device cpu --batches 1 4 --contexts 64 --steps 4
"""

from __future__ import annotations

import argparse
from functools import partial
from typing import Any

import torch
from _common import decode_step_ms, kernel_summary, load_shape, model_args, print_table, random_model, sync, write_json

from hypic_agent.kernels.config import KernelConfig
from hypic_agent.runtime.models.config import HybridConfig
from hypic_agent.runtime.runner.pool import StatePool
from hypic_agent.runtime.runner.runner import ModelRunner
from hypic_agent.runtime.runner.sizing import bytes_per_slot, bytes_per_token, free_device_memory

HBM_TBS = 4.8  # H200


def floor_ms(model: torch.nn.Module, cfg: HybridConfig, batch: int, context: int) -> float:
    """Bytes one decode step must read (and the states write) at ``HBM_TBS``: every non-expert weight,
    the experts a batch of ``batch`` tokens is expected to touch, the KV of every sequence, the
    linear states (read + write)."""
    expert, other = 0, 0
    for name, p in model.named_parameters():
        if ".experts." in name or (name.endswith(("gate_up_proj", "down_proj")) and p.dim() == 3):
            expert += p.nbytes
        else:
            other += p.nbytes
    if cfg.num_experts:
        k = cfg.num_experts_per_tok
        touched = cfg.num_experts * (1 - (1 - k / cfg.num_experts) ** batch)
        expert = int(expert * touched / cfg.num_experts)
    dtype = next(model.parameters()).dtype
    kv = batch * context * bytes_per_token(cfg, dtype)
    states = 2 * batch * bytes_per_slot(cfg, dtype)
    return (other + expert + kv + states) / (HBM_TBS * 1e12) * 1e3


def profile_step(runner: ModelRunner, seqs: list, toks: list) -> dict[str, Any]:
    """The CUDA kernels of one decode step (``_common.kernel_summary``)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        runner.forward(runner.plan(seqs, toks))
        sync()
    return kernel_summary(prof)


def _profile_into(out: list[dict[str, Any]], runner: ModelRunner, seqs: list, toks: list) -> None:
    out.append(profile_step(runner, seqs, toks))


def kernel_config(pairs: list[str]) -> KernelConfig:
    """``KEY=VALUE`` pairs over the defaults (``--kernels graph_norms_fused=false``), checked by
    ``KernelSettings`` as ``HYPIC_KERNELS__*`` would be."""
    from hypic_agent.config_kernels import KernelSettings

    fields = dict(p.split("=", 1) for p in pairs)
    return KernelSettings.model_validate(fields).config()


def main() -> None:
    ap = model_args(argparse.ArgumentParser(description=__doc__))
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64, 128])
    ap.add_argument("--contexts", type=int, nargs="+", default=[2048, 20480])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--page-size", type=int, default=64)
    ap.add_argument("--memory-fraction", type=float, default=0.85, help="of the free memory, for the pool")
    ap.add_argument("--no-graphs", action="store_true")
    ap.add_argument("--profile", action="store_true", help="print the top kernels of one step per row (CUDA)")
    ap.add_argument("--kernels", nargs="*", default=[], metavar="KEY=VALUE", help="kernel choices (KernelSettings)")
    ap.add_argument("--out", default="bench_out/decode.json")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    raw = load_shape(args.shape, args.layers)
    model = random_model(raw, args.device, dtype)
    model.set_kernels(kernel_config(args.kernels))
    if model.kernels.fuse_projections:  # as the engine does
        model.fuse_projections()
    cfg = model.config
    dev = torch.device(args.device)
    max_b = max(args.batches)
    ps = args.page_size
    need = max(b * -(-(c + args.steps + args.warmup + 2) // ps) * ps for b in args.batches for c in args.contexts)
    if dev.type == "cuda":
        free = free_device_memory(dev) * args.memory_fraction - max_b * bytes_per_slot(cfg, dtype)
        kv_tokens = int(min(need, free // bytes_per_token(cfg, dtype)))
        print(f"pool: {kv_tokens} KV rows ({free / 2**30:.1f} GiB free for it)", flush=True)
    else:
        kv_tokens = need
    max_seq = max(args.contexts) + args.steps + args.warmup + 2
    pool = StatePool(
        cfg, slots=max_b, kv_tokens=kv_tokens, page_size=args.page_size, device=dev, dtype=dtype, max_seq_tokens=max_seq
    )
    runner = ModelRunner(model, pool, decode_graphs=not args.no_graphs, max_batch=max_b)
    rows: list[dict[str, Any]] = []
    for context in args.contexts:
        for batch in args.batches:
            profiled: list[dict[str, Any]] = []
            profile = args.profile and dev.type == "cuda" and batch in (1, 64)
            times = decode_step_ms(
                runner,
                pool,
                batch,
                context,
                args.steps,
                args.warmup,
                after=partial(_profile_into, profiled, runner) if profile else None,
            )
            if times is None:
                rows.append({"context": context, "batch": batch, "note": f"does not fit ({kv_tokens} KV rows)"})
                print(f"ctx={context} batch={batch}: skipped (pool)", flush=True)
                continue
            times.sort()
            p50 = times[len(times) // 2]
            fl = floor_ms(model, cfg, batch, context)
            rows.append(
                {
                    "context": context,
                    "batch": batch,
                    "ms_per_step": p50,
                    "tokens_per_s": batch / p50 * 1e3,
                    "hbm_floor_ms": fl,
                    "x_floor": p50 / fl,
                    "graph_replays": getattr(runner.decode_graphs, "replays", 0),
                    **({"profile": profiled[0]} if profiled else {}),
                }
            )
            print(f"ctx={context} batch={batch}: {p50:.2f} ms/step, {batch / p50 * 1e3:.0f} tok/s", flush=True)
            write_json(args.out, {"args": vars(args), "rows": rows, "partial": True})
    print_table(rows, ["context", "batch", "ms_per_step", "tokens_per_s", "hbm_floor_ms", "x_floor"])
    dev_name = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"
    write_json(args.out, {"args": vars(args), "rows": rows, "device": dev_name, "kv_pool_tokens": kv_tokens})


if __name__ == "__main__":
    main()
