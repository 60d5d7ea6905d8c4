"""HYPIC overheads: pair building vs a plain isolated prefill, composition time, bytes and error.

    python benchmarks/overhead.py --shape qwen3_5_35b_a3b --segments 16 --seg-len 1024
    python benchmarks/overhead.py --shape tiny:qwen3_5_text --device cpu --segments 4 --seg-len 64

* build: ``build_entries`` (isolated packed prefill + pairs + KV capture) vs ``prefill`` of the same
  packed batch without pairs: wall time, and on CUDA also GPU-busy time (profiler), since a call
  whose host work (Python, launches) exceeds its kernels' time shows its host cost in the wall.
* compose: ``chain_scan`` over ``--compose-n`` pairs for every linear layer, one launch per layer,
  and all layers in one launch (layers are independent chains: their heads stack, ``[n, L*HV, K, K]``,
  as in a ``w = 0`` request whose linear states can be composed before the forward).
* compose times are device times on CUDA (``_common.device_ms``: events around each launch, median,
  L2 flushed between launches), wall times elsewhere.
* compose at the full depth: the one-launch chain over ``--compose-n`` pairs for *every* linear
  layer of the unreduced shape (30 for Qwen3.5-35B-A3B, whatever ``--layers`` builds), with fp32
  and with bf16 pairs (the kernel reads either and accumulates in fp32), writing every state (what
  a seam-by-seam combine needs) and only the final one (``last_only``: what a ``w = 0`` request needs
  before its suffix; the scan then reads each pair once and writes one state), and for bf16 pairs
  also with ``state_bf16`` (one bf16 dot per pair instead of a hi/lo pair of dots).
* bytes per entry per layer with fp32 and bf16 pairs, and the composed-state error of each against
  a one-pass run (layer 0, seams >= W-1 so the fp32 composition is exact there).
"""

from __future__ import annotations

import argparse

import torch
from _common import device_ms, gpu_busy_ms, load_shape, model_args, print_table, random_model, timed, write_json

from hypic_agent.kernels import chain as chain_ops
from hypic_agent.runtime.hypic.build import build_entries
from hypic_agent.runtime.hypic.combine import combine
from hypic_agent.runtime.hypic.layout import plan_layout
from hypic_agent.runtime.hypic.modes import mode_spec
from hypic_agent.runtime.runner.standalone import prefill


def main() -> None:
    ap = model_args(argparse.ArgumentParser(description=__doc__))
    ap.add_argument("--segments", type=int, default=16)
    ap.add_argument("--seg-len", type=int, default=1024)
    ap.add_argument("--compose-n", type=int, default=64)
    ap.add_argument("--seam", type=int, default=8)
    ap.add_argument("--out", default="bench_out/overhead.json")
    args = ap.parse_args()
    model = random_model(load_shape(args.shape, args.layers), args.device, getattr(torch, args.dtype))
    cfg = model.config
    g = torch.Generator().manual_seed(0)
    segs = [
        tuple(torch.randint(0, cfg.vocab_size, (args.seg_len,), generator=g).tolist()) for _ in range(args.segments)
    ]
    seams = [args.seam] * len(segs)
    t_plain, _ = timed(lambda: prefill(model, [list(s) for s in segs]))
    t_build, _ = timed(lambda: build_entries(model, segs, seams))
    on_gpu = args.device.startswith("cuda")
    g_plain = gpu_busy_ms(lambda: prefill(model, [list(s) for s in segs])) if on_gpu else 0.0
    g_build = gpu_busy_ms(lambda: build_entries(model, segs, seams)) if on_gpu else 0.0
    dev = torch.device(args.device)
    hv, k, v = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
    n = args.compose_n
    T = torch.randn(n, hv, k, k, device=dev) * 0.05
    S = torch.randn(n, hv, k, v, device=dev)
    h0 = torch.zeros(hv, k, v, device=dev)
    n_lin = len(cfg.linear_layers)

    def compose_all() -> None:
        for _ in range(n_lin):
            chain_ops.chain_scan(h0, T, S)

    t_comp, _ = timed(compose_all, reps=5, warmup=2)

    def compose_one_launch(
        layers: int, dtype: torch.dtype = torch.float32, last_only: bool = False, state_bf16: bool = False
    ) -> float:
        """Every layer's chain in one call (heads stacked); the stacked pairs are freed on return."""
        T_all = (torch.randn(n, layers * hv, k, k, device=dev) * 0.05).to(dtype)
        S_all = torch.randn(n, layers * hv, k, v, device=dev).to(dtype)
        h0_all = torch.zeros(layers * hv, k, v, device=dev)
        return (
            device_ms(lambda: chain_ops.chain_scan(h0_all, T_all, S_all, last_only=last_only, state_bf16=state_bf16))
            / 1e3
        )

    t_one = compose_one_launch(n_lin)
    full_shape = load_shape(args.shape)
    full_text = full_shape.get("text_config", full_shape)
    n_full = sum(t == "linear_attention" for t in full_text.get("layer_types", [])) or n_lin
    t_full = {
        (dt, last): compose_one_launch(n_full, getattr(torch, dt), last)
        for dt in ("float32", "bfloat16")
        for last in (False, True)
    }
    t_bf16_state = compose_one_launch(n_full, torch.bfloat16, True, state_bf16=True)
    # bytes and composed-state error (fp32 vs bf16 pairs) at layer 0
    suffix = [1]
    full = prefill(model, [[t for s in segs[:4] for t in s] + suffix])[0]
    rows_b = []
    for pdt in (torch.float32, torch.bfloat16):
        entries = build_entries(model, segs[:4], seams[:4], pair_dtype=pdt)
        st = combine(
            model, plan_layout(list(segs[:4]), list(entries), seams[:4], suffix, dev), list(entries), mode_spec("hypic")
        )
        ref = full.layers[cfg.linear_layers[0]].recurrent
        err = ((st.layers[cfg.linear_layers[0]].recurrent - ref).norm() / ref.norm()).item()
        per = entries[0].bytes_per_layer()
        rows_b.append(
            {
                "pair_dtype": str(pdt).split(".")[-1],
                "linear_layer_bytes": per.get("linear", 0),
                "attention_layer_bytes": per.get("attention", 0),
                "entry_bytes": entries[0].nbytes(),
                "layer0_state_rel_err": err,
            }
        )
    rows = [
        {
            "segments": len(segs),
            "seg_len": args.seg_len,
            "plain_prefill_ms": t_plain * 1e3,
            "build_entries_ms": t_build * 1e3,
            "pair_overhead_pct": (t_build / t_plain - 1) * 100,
            "plain_prefill_gpu_ms": g_plain,
            "build_entries_gpu_ms": g_build,
            "pair_overhead_gpu_pct": (g_build / g_plain - 1) * 100 if g_plain else 0.0,
            "compose_n": n,
            "compose_all_linear_layers_ms": t_comp * 1e3,
            "compose_one_launch_ms": t_one * 1e3,
            "compose_layers_full_depth": n_full,
            "compose_full_depth_fp32_ms": t_full["float32", False] * 1e3,
            "compose_full_depth_bf16_ms": t_full["bfloat16", False] * 1e3,
            "compose_full_depth_fp32_last_ms": t_full["float32", True] * 1e3,
            "compose_full_depth_bf16_last_ms": t_full["bfloat16", True] * 1e3,
            "compose_full_depth_bf16_last_state_bf16_ms": t_bf16_state * 1e3,
        }
    ]
    print_table(rows, list(rows[0]))
    print_table(rows_b, list(rows_b[0]))
    write_json(args.out, {"args": vars(args), "timing": rows, "bytes": rows_b})


if __name__ == "__main__":
    main()
