"""Benchmarks run in a reduced mode on CPU: the plumbing works and the JSON has the expected rows.

Scores and speed are not asserted here; the real runs are in docs/benchmarks.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data"


def run(script: str, *args: str, out: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.skipif(not DATA.is_dir(), reason=f"evaluation data not found at {DATA}")
def test_quality_smoke(tmp_path):
    res = run(
        "quality.py", "--model", "tiny:qwen3_5_text", "--smoke", "--datasets", "hotpotqa", "kv", out=tmp_path / "q.json"
    )
    configs = {(r["dataset"], r["config"]) for r in res["rows"]}
    for ds in ("hotpotqa", "kv"):
        for c in (
            "full_recompute",
            "prefix_cache",
            "addition",
            "transition",
            "transition_rope",
            "hypic w=8",
            "hypic w=0",
            "hypic w=32",
        ):
            assert (ds, c) in configs
    assert all(r["top1_agreement"] >= 0 for r in res["rows"])
    by = {(r["dataset"], r["config"]): r for r in res["rows"]}
    for ds in ("hotpotqa", "kv"):  # the gold answer is scored after every mode; prefix_cache is exact
        assert all(r["gold_nll"] > 0 for r in res["rows"] if r["dataset"] == ds)
        assert abs(by[(ds, "prefix_cache")]["gold_nll"] - by[(ds, "full_recompute")]["gold_nll"]) < 1e-4
    assert (tmp_path / "q.png").exists()


def test_ttft_and_overhead_smoke(tmp_path):
    common = ["--shape", "tiny:qwen3_5_text", "--device", "cpu", "--dtype", "float32"]
    res = run(
        "ttft.py",
        *common,
        "--seg-len",
        "32",
        "--segments",
        "3",
        "--pool",
        "6",
        "--requests",
        "1",
        "--warmup",
        "0",
        "--hit-rates",
        "1.0",
        out=tmp_path / "t.json",
    )
    assert {r["mode"] for r in res["rows"]} >= {"full_recompute", "prefix_cache", "hypic"}
    res = run("overhead.py", *common, "--segments", "2", "--seg-len", "32", out=tmp_path / "o.json")
    assert res["bytes"][0]["layer0_state_rel_err"] < 1e-4


def test_prefill_smoke(tmp_path):
    res = run(
        "prefill.py",
        "--shape",
        "tiny:qwen3_5_moe_text",
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--lengths",
        "32",
        "--reps",
        "1",
        out=tmp_path / "p.json",
    )
    assert res["rows"][0]["tokens"] == 32 and res["rows"][0]["speedup"] > 0
