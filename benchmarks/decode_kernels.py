"""Launch-shape A/B of the decode kernels at the Qwen3.5-35B-A3B decode shapes: the in-place GDN
step over pool slots (``bv`` x ``num_warps``) and paged decode attention (key tile x warps,
splits). Prints the time per call of each variant and the bytes-moved floor, writes JSON.

    python benchmarks/decode_kernels.py --batches 1 64 128 --contexts 2048 20480
"""

from __future__ import annotations

import argparse
from functools import partial
from typing import Any

import torch
from _common import device_ms, print_table, write_json

from hypic_agent.kernels.gdn_decode.gdn_decode_triton import gdn_decode_slots_triton
from hypic_agent.kernels.paged_attention.paged_attention_triton import (
    default_block,
    default_num_splits,
    paged_decode_attention_triton,
)

HBM = 4.8e12


def gdn_rows(batches: list[int]) -> list[dict[str, Any]]:
    H, HV, K, V = 16, 32, 128, 128
    rows = []
    for n in batches:
        pool = torch.zeros(n + 1, HV, K, V, device="cuda")
        slots = torch.arange(1, n + 1, device="cuda")
        q, k = (torch.randn(n, H, K, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        v = torch.randn(n, HV, V, device="cuda", dtype=torch.bfloat16)
        g = -torch.rand(n, HV, device="cuda")
        beta = torch.rand(n, HV, device="cuda", dtype=torch.bfloat16)
        floor = 2 * n * HV * K * V * 4 / HBM * 1e6
        for bv in (8, 16, 32, 64, 128):
            for nw in (1, 2, 4, 8):
                call = partial(gdn_decode_slots_triton, q, k, v, g, beta, pool, slots, True, None, bv=bv, num_warps=nw)
                us = 1e3 * device_ms(call, reps=20, warmup=3)
                rows.append({"op": "gdn", "batch": n, "variant": f"bv={bv} w={nw}", "us": us, "floor_us": floor})
    return rows


def paged_rows(batches: list[int], contexts: list[int]) -> list[dict[str, Any]]:
    Hq, Hkv, D, page = 16, 2, 256, 64
    rows = []
    for ctx in contexts:
        for n in batches:
            pages = n * -(-ctx // page)
            kc = torch.randn(pages + 1, page, Hkv, D, device="cuda", dtype=torch.bfloat16)
            vc = torch.randn_like(kc)
            width = -(-ctx // page)
            table = torch.arange(1, pages + 1, device="cuda", dtype=torch.int32).view(n, width)
            lens = torch.full((n,), ctx, device="cuda", dtype=torch.int32)
            q = torch.randn(n, Hq, D, device="cuda", dtype=torch.bfloat16)
            floor = 2 * n * ctx * Hkv * D * 2 / HBM * 1e6
            base_ns = default_num_splits(n, Hkv, width, page, q.device)
            for ns in sorted({base_ns, max(1, base_ns // 4), min(256, base_ns * 2), 8, 32}):
                for blk in sorted({default_block(D, D), (32, 4), (64, 4), (64, 8), (128, 8)}):
                    call = partial(
                        paged_decode_attention_triton, q, kc, vc, table, lens, D**-0.5, num_splits=ns, block=blk
                    )
                    us = 1e3 * device_ms(call, reps=20, warmup=3)
                    rows.append(
                        {
                            "op": f"paged ctx={ctx}",
                            "batch": n,
                            "variant": f"splits={ns} bn={blk[0]} w={blk[1]}",
                            "us": us,
                            "floor_us": floor,
                        }
                    )
            del kc, vc
            torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 64, 128])
    ap.add_argument("--contexts", type=int, nargs="+", default=[2048, 20480])
    ap.add_argument("--out", default="bench_out/decode_kernels.json")
    args = ap.parse_args()
    rows = gdn_rows(args.batches) + paged_rows(args.batches, args.contexts)
    best: dict[tuple[str, int], dict[str, Any]] = {}
    for r in rows:
        key = (r["op"], r["batch"])
        if key not in best or r["us"] < best[key]["us"]:
            best[key] = r
    print_table(list(best.values()), ["op", "batch", "variant", "us", "floor_us"])
    write_json(args.out, {"args": vars(args), "rows": rows, "best": list(best.values())})


if __name__ == "__main__":
    main()
