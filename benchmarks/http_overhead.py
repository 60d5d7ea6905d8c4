"""What the HTTP server adds to TTFT: the same RAG requests at the same Poisson load, once through
``POST /v1/generate`` (streamed, a real uvicorn server on loopback) and once submitted to the
scheduler directly after the same edge work (``service.prepare_job``: framing, tokenization, keys).

Documents are random ASCII text read by a byte-level tokenizer (one token per character), so any
model shape runs; TTFT is the arrival -> first token event (the first SSE ``data`` event over HTTP).
The HTTP client runs in its own process by default (``--client process``): real clients do not
share the server's GIL; ``--client thread`` keeps it in this process, as the first runs did.

``--interleave``: one Poisson trace per pass, each arrival sent over HTTP or directly (a seeded
shuffle, half each), so both paths see the same load at the same time and drift between passes
(which moved the direct path's p50 by 31% on the H200) cancels; ``--passes`` repeats it with new
seeds. It reports each path's p50/p90 over all passes and the API's share of p50 TTFT with a 95%
bootstrap interval.

    python benchmarks/http_overhead.py --shape qwen3_5_35b_a3b --segments 20 --seg-len 1024 --rate 4
    python benchmarks/http_overhead.py --shape tiny:qwen3_5_text --device cpu --seg-len 64 --segments 4 --requests 6
    python benchmarks/http_overhead.py --shape qwen3_5_35b_a3b --segments 20 --seg-len 1024 --rate 2 --interleave \
        --requests 48 --passes 3
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing as mp
import random
import socket
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import torch
import uvicorn
from _common import load_shape, model_args, print_table, random_model, write_json

from hypic_agent.api import create_app, service
from hypic_agent.api.schemas import GenerateRequest
from hypic_agent.config import Settings
from hypic_agent.runtime.engine import Engine
from hypic_agent.runtime.models.loading.tokenizer import tiny_tokenizer


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))] if xs else float("nan")


def bodies(args: argparse.Namespace) -> list[dict[str, Any]]:
    rng = random.Random(args.seed)
    letters = "abcdefghijklmnopqrstuvwxyz     "
    docs = ["".join(rng.choice(letters) for _ in range(args.seg_len)) for _ in range(args.pool)]
    out = []
    for _ in range(args.requests):
        picked = rng.sample(docs, args.segments)
        segs = [{"kind": "document", "text": d} for d in picked]
        out.append({"segments": segs, "query": "q" * args.query_len, "max_tokens": args.max_tokens})
    return out


def run(send: Any, reqs: list[dict[str, Any]], rate: float, seed: int) -> list[float]:
    """Poisson arrivals of ``reqs``; ``send(body, t_arrival) -> ttft_ms``, each on its own thread."""
    rng = random.Random(seed)
    ttfts: list[float] = []
    threads = []
    t_next = time.perf_counter()
    for body in reqs:
        t_next += rng.expovariate(rate)
        time.sleep(max(0.0, t_next - time.perf_counter()))
        th = threading.Thread(target=lambda b=body, t=time.perf_counter(): ttfts.append(send(b, t)), daemon=True)
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    return ttfts


def run_at(send: Any, reqs: list[dict[str, Any]], start: float, offsets: list[float]) -> list[float]:
    """``send(body, t_sent) -> ttft_ms`` for each of ``reqs`` at ``start + offset`` (``time.monotonic``:
    the same clock in every process on Linux), each on its own thread; TTFTs in ``reqs``' order."""
    ttfts = [float("nan")] * len(reqs)
    threads = []
    for i, (body, off) in enumerate(zip(reqs, offsets, strict=True)):
        time.sleep(max(0.0, start + off - time.monotonic()))

        def go(i: int = i, b: dict[str, Any] = body, t: float = time.perf_counter()) -> None:
            ttfts[i] = send(b, t)

        th = threading.Thread(target=go, daemon=True)
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    return ttfts


def post_streamed(client: httpx.Client, url: str, body: dict[str, Any], t0: float) -> float:
    """``POST`` ``body`` streamed; ms from ``t0`` to the first SSE ``data`` event."""
    with client.stream("POST", url, json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                return (time.perf_counter() - t0) * 1e3
    raise RuntimeError(f"no event: {r.status_code}")


def http_client(url: str, reqs: list[dict[str, Any]], rate: float, seed: int) -> list[float]:
    """``run`` of ``post_streamed`` (in the client process: ``--client process``) on one pooled
    ``httpx.Client``, as an SDK client holds one: a client per request would time its set-up (its TLS
    context alone is ~10-30 ms of CPU) as server overhead."""
    limits = httpx.Limits(max_connections=len(reqs), max_keepalive_connections=len(reqs))
    with httpx.Client(timeout=600, limits=limits) as client:
        return run(functools.partial(post_streamed, client, url), reqs, rate, seed)


def http_client_at(url: str, reqs: list[dict[str, Any]], start: float, offsets: list[float]) -> list[float]:
    """``run_at`` of ``post_streamed`` on one pooled ``httpx.Client`` (see ``http_client``)."""
    limits = httpx.Limits(max_connections=len(reqs) or 1, max_keepalive_connections=len(reqs) or 1)
    with httpx.Client(timeout=600, limits=limits) as client:
        return run_at(functools.partial(post_streamed, client, url), reqs, start, offsets)


def interleaved_pass(
    direct: Any, http_at: Any, reqs: list[dict[str, Any]], rate: float, seed: int
) -> tuple[list[float], list[float]]:
    """One Poisson trace of ``reqs``; a seeded half goes over HTTP (``http_at(reqs, start, offsets)``,
    in the client process), the rest directly from threads here, on the same clock. -> (direct, http) TTFTs."""
    rng = random.Random(seed)
    offsets, t = [], 0.0
    for _ in reqs:
        t += rng.expovariate(rate)
        offsets.append(t)
    over_http = [i % 2 == 1 for i in range(len(reqs))]
    rng.shuffle(over_http)
    start = time.monotonic() + 1.0  # the client process has a second to receive its share
    pick = [i for i in range(len(reqs)) if over_http[i]]
    rest = [i for i in range(len(reqs)) if not over_http[i]]
    http_future = http_at([reqs[i] for i in pick], start, [offsets[i] for i in pick])
    direct_ttft = run_at(direct, [reqs[i] for i in rest], start, [offsets[i] for i in rest])
    return direct_ttft, http_future.result()


def share_interval(direct: list[float], http: list[float], seed: int, draws: int = 2000) -> tuple[float, float]:
    """95% bootstrap interval of ``p50(http) / p50(direct) - 1`` (each path resampled on its own)."""
    rng = random.Random(seed)
    stats = sorted(
        pct(rng.choices(http, k=len(http)), 0.5) / pct(rng.choices(direct, k=len(direct)), 0.5) - 1
        for _ in range(draws)
    )
    return stats[int(0.025 * draws)], stats[int(0.975 * draws) - 1]


def main() -> None:
    ap = model_args(argparse.ArgumentParser(description=__doc__))
    ap.add_argument("--segments", type=int, default=20)
    ap.add_argument("--seg-len", type=int, default=1024)
    ap.add_argument("--pool", type=int, default=40, help="documents the requests draw from (warm after the first pass)")
    ap.add_argument("--query-len", type=int, default=50)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--rate", type=float, default=2.0, help="offered load, requests/s")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--client", choices=["process", "thread"], default="process",
        help="HTTP client in its own process (as real clients are: no share of the server's GIL) or in threads here",
    )  # fmt: skip
    ap.add_argument(
        "--switch-interval-ms", type=float, default=None,
        help="HYPIC_SWITCH_INTERVAL_MS for the server (the whole process: both paths); default Python's 5 ms",
    )  # fmt: skip
    ap.add_argument("--interleave", action="store_true", help="both paths in one trace, half each (see above)")
    ap.add_argument("--passes", type=int, default=1, help="--interleave: traces, each with its own seed")
    ap.add_argument("--out", default="bench_out/http_overhead.json")
    args = ap.parse_args()
    model = random_model(load_shape(args.shape, args.layers), args.device, getattr(torch, args.dtype))
    home = Path(tempfile.mkdtemp(prefix="hypic-http-"))
    ctx = args.segments * (args.seg_len + 16) + args.query_len + args.max_tokens + 64
    settings = Settings(
        home=home,
        device=args.device,
        max_context=ctx,
        gpu_budget_bytes=40 << 30,
        switch_interval_ms=args.switch_interval_ms,
    )
    engine = Engine(model, tiny_tokenizer(), "http-bench", settings, name="bench")
    app = create_app(settings, engine=engine)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{port}/v1/generate"
    st = app.state.hypic

    clients = ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) if args.client == "process" else None
    if clients is not None:
        clients.submit(time.sleep, 0).result()  # the client process is up (imports done) before timing

    def over_http_run(reqs: list[dict[str, Any]], rate: float, seed: int) -> list[float]:
        if clients is None:
            return http_client(url, reqs, rate, seed)
        return clients.submit(http_client, url, reqs, rate, seed).result()

    def direct(body: dict[str, Any], t0: float) -> float:
        req = GenerateRequest.model_validate(body)
        job = service.prepare_job(st, req, [s.to_segment() for s in req.segments], req.query, "default")
        for _ in service.run_job(st, job):
            return (time.perf_counter() - t0) * 1e3
        raise RuntimeError("no event")

    reqs = bodies(args)
    run(direct, reqs, 1e9, args.seed)  # warm-up (all at once): every document cached, graphs captured
    if args.interleave:
        if clients is None:
            raise SystemExit("--interleave needs --client process")
        summary = interleaved(args, direct, functools.partial(clients.submit, http_client_at, url), reqs)
        clients.shutdown()
        server.should_exit = True
        engine.close()
        dev = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
        write_json(args.out, {"args": vars(args), **summary, "device": dev})
        return
    rows: list[dict[str, Any]] = []
    for name in ("direct", "http", "direct again", "http again"):
        if name.startswith("http"):
            ttft = over_http_run(reqs, args.rate, args.seed + 1)
        else:
            ttft = run(direct, reqs, args.rate, args.seed + 1)
        rows.append({"path": name, "p50_ttft_ms": pct(ttft, 0.5), "p90_ttft_ms": pct(ttft, 0.9), "n": len(ttft)})
        print(rows[-1], flush=True)
    direct_p50 = min(r["p50_ttft_ms"] for r in rows if r["path"].startswith("direct"))
    http_p50 = min(r["p50_ttft_ms"] for r in rows if r["path"].startswith("http"))
    for r in rows:
        r["x_direct_best_p50"] = r["p50_ttft_ms"] / direct_p50
    print_table(rows, ["path", "p50_ttft_ms", "p90_ttft_ms", "x_direct_best_p50", "n"])
    print(f"the API adds {100 * (http_p50 / direct_p50 - 1):.1f}% to p50 TTFT (best of two runs each)")
    if clients is not None:
        clients.shutdown()
    server.should_exit = True
    engine.close()
    dev = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    write_json(
        args.out, {"args": vars(args), "rows": rows, "api_overhead_p50": http_p50 / direct_p50 - 1, "device": dev}
    )


def interleaved(args: argparse.Namespace, direct: Any, http_at: Any, reqs: list[dict[str, Any]]) -> dict[str, Any]:
    """``--passes`` interleaved traces; prints and returns per-path rows and the API's p50 share."""
    ttft: dict[str, list[float]] = {"direct": [], "http": []}
    passes = []
    for k in range(args.passes):
        d, h = interleaved_pass(direct, http_at, reqs, args.rate, args.seed + 1 + k)
        ttft["direct"] += d
        ttft["http"] += h
        passes.append(
            {"pass": k, "direct_p50": pct(d, 0.5), "http_p50": pct(h, 0.5), "share": pct(h, 0.5) / pct(d, 0.5) - 1}
        )
        print(passes[-1], flush=True)
    rows = [{"path": p, "p50_ttft_ms": pct(x, 0.5), "p90_ttft_ms": pct(x, 0.9), "n": len(x)} for p, x in ttft.items()]
    share = rows[1]["p50_ttft_ms"] / rows[0]["p50_ttft_ms"] - 1
    lo, hi = share_interval(ttft["direct"], ttft["http"], args.seed)
    print_table(rows, ["path", "p50_ttft_ms", "p90_ttft_ms", "n"])
    print(f"the API adds {100 * share:.1f}% to p50 TTFT (95% interval {100 * lo:.1f}% .. {100 * hi:.1f}%)")
    return {
        "rows": rows,
        "passes": passes,
        "api_overhead_p50": share,
        "api_overhead_p50_ci95": [lo, hi],
        "ttft_ms": ttft,
    }


if __name__ == "__main__":
    main()
