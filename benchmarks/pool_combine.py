"""A composed request's prepare into the state pool: the old path (a standalone ``RequestState``, then
``StatePool.load``) against the combine writing straight into the request's pages
(``runner.destination.StateDestination``), warm (every document cached), same engine and pool.

Reports per path the median prepare ms (combine + getting the state into the pool; the old path's
``StatePool.load`` alone as ``old_load_ms``), the attention
K/V bytes of the standalone state the old path builds and copies (the new path builds none when the
pages are one run), and the process's peak RSS (``--path old`` / ``--path new`` in separate runs
for a peak that belongs to one path).

    python benchmarks/pool_combine.py --device cpu --dtype float32 --segments 16 --seg-len 1024
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from typing import Any

import torch
from _common import load_shape, model_args, random_model, sync, write_json
from ttft import Plan, Seg

from hypic_agent.config import Settings
from hypic_agent.runtime.engine import Engine
from hypic_agent.runtime.runner.destination import StateDestination
from hypic_agent.runtime.serving import build_pool
from hypic_agent.runtime.state import AttentionLayerState


def widen(raw: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The tiny config made moderate: wider, deeper, a longer context."""
    n = args.layers_total
    return raw | {
        "hidden_size": args.hidden,
        "intermediate_size": 2 * args.hidden,
        "num_attention_heads": args.kv_heads * 2,
        "num_key_value_heads": args.kv_heads,
        "head_dim": args.head_dim,
        "num_hidden_layers": n,
        "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)],
        "max_position_embeddings": 1 << 16,
    }


def main() -> None:
    ap = model_args(argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))
    ap.set_defaults(shape="tiny:qwen3_5_text", device="cpu", dtype="float32")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--layers-total", type=int, default=8)
    ap.add_argument("--segments", type=int, default=16)
    ap.add_argument("--seg-len", type=int, default=1024)
    ap.add_argument("--query-len", type=int, default=50)
    ap.add_argument("--seam", type=float, default=8)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--path", choices=["old", "new", "both"], default="both")
    ap.add_argument("--out", default="bench_out/pool_combine.json")
    args = ap.parse_args()
    raw = load_shape(args.shape)
    if args.shape.startswith("tiny:"):
        raw = widen(raw, args)
    model = random_model(raw, args.device, getattr(torch, args.dtype))
    total = args.segments * args.seg_len + args.query_len
    settings = Settings(
        min_cached_tokens=4, max_running=2, kv_pool_tokens=2 * total + 64, max_context=total + 64, cuda_graphs=False
    )
    engine = Engine(model, None, "pool-bench", settings)
    pool = build_pool(engine)
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    docs = [Seg(tuple(torch.randint(0, vocab, (args.seg_len,), generator=g).tolist())) for _ in range(args.segments)]
    plan = Plan(docs, torch.randint(0, vocab, (args.query_len,), generator=g).tolist())
    p = engine.pieces(plan, mode="hypic", seam=args.seam)
    engine.prepare_pieces(p)  # cold: every document built and cached

    load_ms: list[float] = []

    def old() -> tuple[float, int]:
        seq = pool.alloc(p.total)
        assert seq is not None
        t0 = time.perf_counter()
        st = engine.prepare_pieces(p).state
        assert st is not None
        sync()
        t1 = time.perf_counter()
        pool.load(seq, st)
        sync()
        ms = (time.perf_counter() - t0) * 1e3
        load_ms.append((time.perf_counter() - t1) * 1e3)
        kv = sum(x.nbytes() for x in st.layers if isinstance(x, AttentionLayerState))
        pool.free(seq)
        return ms, kv

    def new() -> tuple[float, int]:
        seq = pool.alloc(p.total)
        assert seq is not None
        t0 = time.perf_counter()
        into = StateDestination.of(pool, seq, p.total)
        st = engine.prepare_pieces(p, into=into).state
        assert st is not None
        into.commit(st)
        sync()
        ms = (time.perf_counter() - t0) * 1e3
        assert into.first is not None
        pool.free(seq)
        return ms, 0

    paths = {"old": old, "new": new}
    names = ["old", "new"] if args.path == "both" else [args.path]
    times: dict[str, list[float]] = {n: [] for n in names}
    kv_bytes: dict[str, int] = {}
    for _ in range(args.reps + 1):  # the first round warms up
        for n in names:
            ms, kv = paths[n]()
            times[n].append(ms)
            kv_bytes[n] = kv
    row = {
        "prompt_tokens": p.total,
        "recomputed_tokens": engine.prepare_pieces(p).recomputed_tokens,
        "device": str(engine.device),
        "dtype": args.dtype,
        **{f"{n}_ms_median": statistics.median(times[n][1:]) for n in names},
        **{f"{n}_ms_all": [round(x, 2) for x in times[n][1:]] for n in names},
        **{f"{n}_standalone_kv_bytes": kv_bytes[n] for n in names},
        **({"old_load_ms_median": statistics.median(load_ms[1:])} if load_ms else {}),
        "pool_bytes": pool.usage().bytes_total,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    print(row, flush=True)
    write_json(args.out, {"args": vars(args), "row": row})


if __name__ == "__main__":
    main()
