"""``benchmarks/host_overhead.py`` in a reduced run on CPU: the plumbing works and the JSON has a row per
batch with every event delivered (timings are not asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_host_overhead_smoke(tmp_path):
    out = tmp_path / "host.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "host_overhead.py"), "--batches", "1", "3", "--steps", "4"]
    proc = subprocess.run(
        [*cmd, "--warmup", "1", "--prompt", "8", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["batch"] for r in rows] == [1, 3]
    for r in rows:  # max_tokens = steps + warmup + 1 token events and a finish event per request
        assert r["events"] == r["batch"] * (4 + 1 + 1 + 1)
        assert r["step_ms"] >= r["host_ms"] > 0 and r["host_us_per_req"] > 0
