"""The combine's two seam-window kernels at the Qwen3.5-35B-A3B combine shape, each variant side by side.

* WY chain (``combine_scan/combine_scan_triton``): 20 seam windows of 8 tokens, each followed by a cached
  body pair, then a 50-token question (24 steps, 32 value heads of 128 x 128, fp32 pairs); state
  dots in tf32x3 (``precise``) or one tf32 pass (the default for bf16 outputs).
* Split-K attention (``attention/attention_triton``): the same 210 queries (16 heads of 256, 2 kv
  heads) over the 20,530-token spliced prompt; the per-block visibility check against the
  up-front count of ascending keys (what combine runs).

    python benchmarks/combine_kernels.py --out bench_out/combine_kernels.json

Columns: ``size`` = chain steps / queries; ``rel_err`` = the final state against the tf32x3 chain
(WY) / the output against the SDPA twin with the position mask (split-K).
"""

from __future__ import annotations

import argparse

import torch
from _common import device_ms, print_table, write_json

from hypic_agent.kernels.attention import attention
from hypic_agent.kernels.combine_scan import plan_steps


def wy_rows(reps: int) -> list[dict[str, object]]:
    from hypic_agent.kernels.combine_scan import combine_scan_triton as wy

    dev, HV, K, V = torch.device("cuda"), 32, 128, 128
    g = torch.Generator(device=dev).manual_seed(0)
    meta, t = [], 0
    for _ in range(20):
        meta += [(0, t, t + 8), (1, 0, 0)]
        t += 8
    meta.append((0, t, t + 50))
    T = t + 50
    eye = torch.eye(K, device=dev)
    pairs = [(0.9 * eye + 0.05 * torch.randn(HV, K, K, device=dev, generator=g),
              0.1 * torch.randn(HV, K, V, device=dev, generator=g)) for _ in range(20)]  # fmt: skip
    ptrs = torch.zeros(1, len(meta), 2, dtype=torch.int64)
    bodies = [i for i, m in enumerate(meta) if m[0] == 1]
    for i, (pt, ps) in zip(bodies, pairs, strict=True):
        ptrs[0, i] = torch.tensor([pt.data_ptr(), ps.data_ptr()])
    steps = plan_steps(meta, ptrs, dev, chunk_size=16)
    q, k = (torch.randn(T, 16, K, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(2))
    v = torch.randn(T, HV, V, device=dev, dtype=torch.bfloat16, generator=g)
    gl = -0.1 * torch.rand(T, HV, device=dev, generator=g)
    beta = torch.rand(T, HV, device=dev, generator=g)
    f = wy.wy_factors_triton(q, k, v, gl, beta, steps.chunks, 16)
    h0 = torch.randn(HV, K, V, device=dev, generator=g)
    rows, ref = [], None
    for precise in (True, False):

        def run(precise: bool = precise) -> tuple[torch.Tensor, torch.Tensor]:
            return wy.wy_chain_triton(f, steps.meta, steps.ptrs[0], h0, torch.bfloat16, 16, precise=precise)

        h = run()[1]
        ref = h if ref is None else ref
        err = float((h - ref).norm() / ref.norm())
        name = "tf32x3" if precise else "tf32 (one pass)"
        ms = device_ms(run, reps=reps)
        rows.append({"kernel": "wy_chain", "variant": name, "size": steps.meta.shape[0], "ms": ms, "rel_err": err})
    return rows


def splitk_rows(reps: int) -> list[dict[str, object]]:
    from hypic_agent.kernels.attention.attention_triton import splitk_attention_triton

    dev, Tk, Hq, Hkv, D = torch.device("cuda"), 20530, 16, 2, 256
    g = torch.Generator(device=dev).manual_seed(0)
    qpos = torch.cat([torch.arange(i * 1024, i * 1024 + 8) for i in range(20)] + [torch.arange(Tk - 50, Tk)]).to(dev)
    q = torch.randn(qpos.numel(), Hq, D, device=dev, dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(Tk, Hkv, D, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(2))
    kpos = torch.arange(Tk, device=dev)
    ref = attention(q, k, v, q_positions=qpos, k_positions=kpos, backend="torch").float()
    rows = []
    for asc in (False, True):

        def run(asc: bool = asc) -> torch.Tensor:
            return splitk_attention_triton(q, k, v, qpos, kpos, D**-0.5, keys_ascending=asc)

        err = float((run().float() - ref).norm() / ref.norm())
        name = "ascending keys" if asc else "per-block check"
        ms = device_ms(run, reps=reps)
        rows.append({"kernel": "splitk_attention", "variant": name, "size": qpos.numel(), "ms": ms, "rel_err": err})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out", default="bench_out/combine_kernels.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("combine_kernels.py times Triton kernels: run it on a GPU")
    rows = wy_rows(args.reps) + splitk_rows(args.reps)
    print_table(rows, ["kernel", "variant", "size", "ms", "rel_err"])
    write_json(args.out, {"args": vars(args), "rows": rows, "device": torch.cuda.get_device_name()})


if __name__ == "__main__":
    main()
