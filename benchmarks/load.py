"""Bounded load run against the API server on loopback: throughput, latency, errors, store consistency.

    python benchmarks/load.py                          # starts `hypic-agent serve --model tiny:qwen3_5_text`
    python benchmarks/load.py --url http://127.0.0.1:8000 --requests 500 --concurrency 16

Each request is a system segment + 2-4 documents from a shared pool (random order; some by stored
id, some inline) + a query; with probability ``--miss-ratio`` it also carries a never-seen
document (a cold segment). Some requests stream (SSE). Afterwards the store is checked: every
segment the server reported is listed and readable, each stored segment was prefilled exactly
once (``hypic_cold_segments_total`` == stored entries; with evictions, at least once: an evicted
entry keeps its row and is rebuilt on its next use), the queue is empty, and (when this script
started the server) every row with a payload has its file and checksum, no file lacks its row,
and every entry re-reads from the disk tier with a valid checksum after shutdown. Tight budgets
(``HYPIC_CPU_BUDGET_BYTES`` / ``HYPIC_DISK_BUDGET_BYTES`` in the environment) run it under eviction.
Prints a table and writes JSON (``--out``). Exit status 1 when errors > 0 or a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from _common import ServeProcess

ROOT = Path(__file__).resolve().parents[1]
WORDS = [
    "river",
    "city",
    "north",
    "market",
    "bridge",
    "museum",
    "winter",
    "harbor",
    "garden",
    "station",
    "library",
    "tower",
    "valley",
    "forest",
]


def document(i: int, rng: random.Random, words: int) -> str:
    body = " ".join(rng.choice(WORDS) for _ in range(words))
    return f"Record {i}. The {WORDS[i % len(WORDS)]} of district {i} is described as follows: {body}."


class Workload:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        rng = random.Random(args.seed)
        self.system = {"kind": "system", "text": "You answer from the records, briefly and exactly."}
        self.pool = [document(i, rng, args.doc_words) for i in range(args.docs)]
        self.ids: dict[int, str] = {}
        self.rngs = [random.Random(args.seed * 1000 + i) for i in range(args.requests)]

    def register(self, http: httpx.Client) -> None:
        """Store half of the pool up front (referenced by id later)."""
        half = list(range(0, len(self.pool), 2))
        r = http.put("/v1/segments", json={"segments": [{"kind": "document", "text": self.pool[i]} for i in half]})
        r.raise_for_status()
        self.ids = {i: d["id"] for i, d in zip(half, r.json()["data"], strict=True)}

    def request(self, n: int) -> tuple[dict[str, Any], bool]:
        rng = self.rngs[n]
        picks = rng.sample(range(len(self.pool)), rng.randint(2, 4))
        segs: list[dict[str, Any]] = [self.system]
        for i in picks:
            use_id = i in self.ids and rng.random() < 0.5
            segs.append({"id": self.ids[i]} if use_id else {"kind": "document", "text": self.pool[i]})
        miss = rng.random() < self.args.miss_ratio
        if miss:
            segs.insert(rng.randint(1, len(segs)), {"kind": "memory", "text": document(10_000 + n, rng, 40)})
        body = {
            "segments": segs,
            "query": f"What is said about district {picks[0]}?",
            "max_tokens": self.args.max_tokens,
            "stream": rng.random() < self.args.stream_ratio,
        }
        return body, miss


def one(http: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    out: dict[str, Any] = {"stream": body["stream"]}
    try:
        if body["stream"]:
            final = None
            with http.stream("POST", "/v1/generate", json=body) as r:
                out["status"] = r.status_code
                for line in r.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        ev = json.loads(line[6:])
                        if "error" in ev:
                            out["error"] = ev["error"]["type"]
                        if ev.get("usage"):
                            final = ev
            data = final or {}
        else:
            r = http.post("/v1/generate", json=body)
            out["status"] = r.status_code
            data = r.json()
            if r.status_code != 200:
                out["error"] = data.get("error", {}).get("type", str(r.status_code))
    except httpx.HTTPError as e:
        out["status"], out["error"] = 0, type(e).__name__
        data = {}
    out["latency_ms"] = (time.perf_counter() - t0) * 1e3
    if "usage" in data:
        u = data["usage"]
        out.update(
            ttft_ms=data["timings"]["ttft_ms"],
            queue_ms=data["timings"].get("queue_ms", 0.0),
            prompt_tokens=u["prompt_tokens"],
            cached_tokens=u["cached_tokens"],
            ids=[s["id"] for s in u["segments"]],
            hits=sum(s["hit"] for s in u["segments"]),
            segments=len(u["segments"]),
        )
    elif "error" not in out:
        out["error"] = "no usage in response"
    return out


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))]


def metric(text: str, name: str) -> float | None:
    m = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else None


def check_store(http: httpx.Client, results: list[dict[str, Any]]) -> dict[str, Any]:
    listed: list[str] = []
    after = None
    while True:
        page = http.get("/v1/segments", params={"limit": 200, **({"after": after} if after else {})}).json()
        listed += [d["id"] for d in page["data"]]
        if not page["has_more"]:
            break
        after = page["next"]
    reported = {i for r in results for i in r.get("ids", [])}
    unreadable = [i for i in listed if http.get(f"/v1/segments/{i}").status_code != 200]
    metrics = http.get("/metrics").text
    cold = metric(metrics, "hypic_cold_segments_total")
    evicted = metric(metrics, "hypic_store_evicted_total") or 0
    checks = {
        "listed": len(listed),
        "unique": len(set(listed)) == len(listed),
        "reported_all_listed": reported <= set(listed),
        "all_readable": not unreadable,
        "cold_prefills": cold,
        "evicted": evicted,
        "one_prefill_per_segment": cold == len(listed) if not evicted else (cold or 0) >= len(listed),
        "queue_empty": metric(metrics, "hypic_queue_depth") == 0,
        "store_corrupt": metric(metrics, "hypic_store_corrupt_total"),
    }
    checks["ok"] = all(
        [checks["unique"], checks["reported_all_listed"], checks["all_readable"], checks["one_prefill_per_segment"]]
    ) and checks["queue_empty"] and not checks["store_corrupt"]  # fmt: skip
    return checks


def check_disk(home: Path) -> dict[str, Any]:
    """After shutdown, as the server left it: every row with a payload has its file and checksum,
    no file is without its row (orphans), and every stored entry re-reads from the disk tier
    (checksum verified on read)."""
    sys.path.insert(0, str(ROOT))
    from hypic_agent.config import Settings
    from hypic_agent.segments.store.registry import Registry
    from hypic_agent.segments.store.segment_store import SegmentStore

    settings = Settings(home=home, device="cpu")
    root = settings.resolved_store_dir()
    files = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
    registry = Registry(settings.resolved_database_url())
    rows = registry.records()
    registry.close()
    located = {r.location for r in rows if r.location}
    no_file = [r.key for r in rows if r.tier != "none" and (r.location not in files or not r.checksum)]
    orphans = sorted(files - located)
    with SegmentStore.from_settings(settings) as store:
        recs = [r for r in store.registry.records() if r.location is not None]
        tiers = [store.get(r.key) for r in recs]
        bad = sum(1 for t in tiers if t is None or t[1] != "disk")
        return {
            "rows": len(rows),
            "rows_without_payload": sum(r.tier == "none" for r in rows),
            "rows_missing_file_or_checksum": len(no_file),
            "orphan_files": len(orphans),
            "entries_on_disk": len(recs),
            "reread_ok": len(recs) - bad,
            "ok": bad == 0 and store.stats().corrupt == 0 and not no_file and not orphans,
        }


def summarize(args: argparse.Namespace, results: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    ok = [r for r in results if "error" not in r]
    lat = [r["latency_ms"] for r in ok]
    warm = [r["latency_ms"] for r in ok if r["hits"] == r["segments"]]
    cold = [r["latency_ms"] for r in ok if r["hits"] < r["segments"]]
    prompt = sum(r["prompt_tokens"] for r in ok)
    return {
        "requests": len(results),
        "concurrency": args.concurrency,
        "errors": len(results) - len(ok),
        "error_types": sorted({r["error"] for r in results if "error" in r}),
        "wall_s": round(wall_s, 3),
        "throughput_rps": round(len(results) / wall_s, 2),
        "latency_ms": {"p50": pct(lat, 50), "p90": pct(lat, 90), "p99": pct(lat, 99), "max": max(lat, default=0)},
        "latency_all_hit_ms": {"n": len(warm), "p50": pct(warm, 50), "p99": pct(warm, 99)},
        "latency_with_miss_ms": {"n": len(cold), "p50": pct(cold, 50), "p99": pct(cold, 99)},
        "server_ttft_ms": {"p50": pct([r["ttft_ms"] for r in ok], 50), "p99": pct([r["ttft_ms"] for r in ok], 99)},
        "server_queue_ms": {"p50": pct([r["queue_ms"] for r in ok], 50), "p99": pct([r["queue_ms"] for r in ok], 99)},
        "cached_token_share": round(sum(r["cached_tokens"] for r in ok) / prompt, 4) if prompt else 0.0,
        "segment_hit_rate": round(sum(r["hits"] for r in ok) / max(1, sum(r["segments"] for r in ok)), 4),
        "streamed": sum(r["stream"] for r in results),
    }


def print_table(summary: dict[str, Any], checks: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"load: {summary['requests']} requests, {summary['concurrency']} concurrent")
    t.add_column("metric")
    t.add_column("value", justify="right")
    lat, w, c = summary["latency_ms"], summary["latency_all_hit_ms"], summary["latency_with_miss_ms"]
    rows = [
        ("throughput (req/s)", f"{summary['throughput_rps']:.2f}"),
        ("latency p50 / p90 / p99 (ms)", f"{lat['p50']:.1f} / {lat['p90']:.1f} / {lat['p99']:.1f}"),
        (f"all-hit requests p50 / p99 (ms), n={w['n']}", f"{w['p50']:.1f} / {w['p99']:.1f}"),
        (f"with a cold segment p50 / p99 (ms), n={c['n']}", f"{c['p50']:.1f} / {c['p99']:.1f}"),
        (
            "server ttft p50 / p99 (ms)",
            f"{summary['server_ttft_ms']['p50']:.1f} / {summary['server_ttft_ms']['p99']:.1f}",
        ),
        (
            "server queue wait p50 / p99 (ms)",
            f"{summary['server_queue_ms']['p50']:.1f} / {summary['server_queue_ms']['p99']:.1f}",
        ),
        ("segment hit rate", f"{summary['segment_hit_rate']:.1%}"),
        ("cached share of prompt tokens", f"{summary['cached_token_share']:.1%}"),
        ("errors", str(summary["errors"])),
        ("store consistent", str(checks.get("ok"))),
    ]
    for k, v in rows:
        t.add_row(k, v)
    Console().print(t)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", help="a running server (default: start one)")
    p.add_argument("--model", default="tiny:qwen3_5_text", help="model for the server this script starts")
    p.add_argument("--home", type=Path, help="HYPIC_HOME of the started server (default: a temp dir)")
    p.add_argument("--api-key")
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--docs", type=int, default=16, help="shared document pool")
    p.add_argument("--doc-words", type=int, default=60)
    p.add_argument("--miss-ratio", type=float, default=0.25)
    p.add_argument("--stream-ratio", type=float, default=0.25)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "load.json")
    args = p.parse_args()

    server, home = None, None
    url = args.url
    if url is None:
        home = args.home or Path(tempfile.mkdtemp(prefix="hypic-load-"))
        env = {
            "HYPIC_HOME": str(home),
            "HYPIC_MODEL": args.model,
            "HYPIC_DEVICE": os.environ.get("HYPIC_DEVICE", "cpu"),
        }
        server = ServeProcess(env, home / "server.log", start_timeout_s=180).start()
        url = server.url
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    work = Workload(args)
    try:
        limits = httpx.Limits(max_connections=args.concurrency * 2)
        with httpx.Client(base_url=url, timeout=120, headers=headers, limits=limits) as http:
            work.register(http)
            bodies = [work.request(n)[0] for n in range(args.requests)]
            t0 = time.perf_counter()
            with ThreadPoolExecutor(args.concurrency) as pool:
                results = list(pool.map(lambda b: one(http, b), bodies))
            wall = time.perf_counter() - t0
            summary = summarize(args, results, wall)
            checks = check_store(http, results)
    finally:
        if server is not None:
            server.stop()
    if home is not None:
        checks["disk"] = check_disk(home)
        checks["ok"] = checks["ok"] and checks["disk"]["ok"]
    print_table(summary, checks)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {"config": {k: str(v) for k, v in vars(args).items()}, "summary": summary, "store": checks}
    report["config"]["server"] = url
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")
    print(json.dumps({"store": checks}, indent=1))
    return 0 if summary["errors"] == 0 and checks["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
