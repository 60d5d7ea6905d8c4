"""What the HTTP server adds to TTFT: the same RAG requests at the same Poisson load, once through
``POST /v1/generate`` (streamed, a real uvicorn server on loopback) and once submitted to the
scheduler directly after the same edge work (``service.prepare_job``: framing, tokenization, keys).

Documents are random ASCII text read by a byte-level tokenizer (one token per character), so any
model shape runs; TTFT is the arrival -> first token event (the first SSE ``data`` event over HTTP).
The HTTP client runs in its own process by default (``--client process``): real clients do not
share the server's GIL; ``--client thread`` keeps it in this process, as the first runs did.

    python benchmarks/http_overhead.py --shape qwen3_5_35b_a3b --segments 20 --seg-len 1024 --rate 4
    python benchmarks/http_overhead.py --shape tiny:qwen3_5_text --device cpu --seg-len 64 --segments 4 --requests 6
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
from hypic_agent.runtime.models.tokenizer import tiny_tokenizer


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


if __name__ == "__main__":
    main()
