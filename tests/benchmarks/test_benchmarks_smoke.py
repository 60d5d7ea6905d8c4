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
    for ds in ("hotpotqa", "kv"):  # the gold answer is scored after every mode; w=0 transition_rope is hypic w=0
        assert all(r["gold_nll"] > 0 for r in res["rows"] if r["dataset"] == ds)
        assert abs(by[(ds, "hypic w=0")]["gold_nll"] - by[(ds, "transition_rope")]["gold_nll"]) < 1e-4
    assert (tmp_path / "q.png").exists()


@pytest.mark.skipif(not DATA.is_dir(), reason=f"evaluation data not found at {DATA}")
def test_quality_shards_merge_to_one_run(tmp_path):
    """``--skip`` shards joined by ``quality_merge.py`` give the rows of one run; the comparison
    script renders them."""
    common = ("--model", "tiny:qwen3_5_text", "--smoke", "--datasets", "hotpotqa", "--modes", "hypic", "--seams", "4")
    one = run("quality.py", *common, "--limit", "2", out=tmp_path / "one.json")
    run("quality.py", *common, "--limit", "1", out=tmp_path / "p0.json")
    run("quality.py", *common, "--limit", "2", "--skip", "1", out=tmp_path / "p1.json")
    merged = run("quality_merge.py", str(tmp_path / "p0.json"), str(tmp_path / "p1.json"), out=tmp_path / "m.json")
    a = {r["config"]: r for r in one["rows"]}
    b = {r["config"]: r for r in merged["rows"]}
    assert a.keys() == b.keys() == {"full_recompute", "hypic w=8", "hypic w=4"}
    for cfg in a:
        assert b[cfg]["n"] == 2
        for key in ("kl", "top1", "nll"):
            assert b[cfg]["per_example"][key] == pytest.approx(a[cfg]["per_example"][key], rel=1e-5, abs=1e-6)
        assert b[cfg]["gold_nll_delta"] == pytest.approx(a[cfg]["gold_nll_delta"], abs=1e-6)
    bad = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "quality_merge.py"), str(tmp_path / "p1.json"), "--out", "x.json"],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert bad.returncode != 0 and "expected 0" in bad.stderr
    cmp = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "quality_compare.py"), "--run", f"a={tmp_path / 'm.json'}",
         "--run", f"b={tmp_path / 'one.json'}", "--config", "hypic w=4", "--out", str(tmp_path / "c.png")],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert cmp.returncode == 0, cmp.stderr[-2000:]
    assert cmp.stdout.count("| hotpotqa |") == 2 and (tmp_path / "c.png").exists()


# a mode with A/B knobs: kernel choices (short and field names) and a Settings field, one engine each
KNOBS = "hypic@precise_for_half=true,moe_slots=0,bucket_step=512,precompose_leading_bodies=false,graph_after=0"


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
        "--modes",
        "full_recompute",
        "prefix_cache",
        "hypic",
        KNOBS,
        out=tmp_path / "t.json",
    )
    assert {r["mode"] for r in res["rows"]} == {"full_recompute", "prefix_cache", "hypic", KNOBS}
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


def test_grammar_smoke(tmp_path):
    res = run("grammar.py", "--tokenizers", "tiny", "--engines", "xgrammar", "--reps", "1", out=tmp_path / "g.json")
    rows = {(r["engine"], r["case"]): r for r in res["rows"]}
    assert set(rows) == {("xgrammar", "json_object"), ("xgrammar", "json_schema"), ("xgrammar", "tool_call")}
    assert all(r["tokens"] > 0 and r["total_us"] > 0 for r in rows.values())


def test_serving_benchmarks_smoke(tmp_path):
    dec = run(
        "decode.py", "--shape", "tiny:qwen3_5_text", "--device", "cpu", "--dtype", "float32", "--batches", "1", "3",
        "--contexts", "40", "--steps", "2", "--warmup", "1", out=tmp_path / "d.json",
    )  # fmt: skip
    assert [(r["context"], r["batch"]) for r in dec["rows"]] == [(40, 1), (40, 3)]
    assert all(r["ms_per_step"] > 0 and r["hbm_floor_ms"] > 0 for r in dec["rows"])
    qps = run(
        "qps.py", "--shape", "tiny:qwen3_5_text", "--device", "cpu", "--dtype", "float32", "--modes", "hypic",
        "--seg-len", "24", "--segments", "3", "--pool", "8", "--loads", "8", "--per-load", "3", "--warm-requests", "2",
        "--max-tokens", "3", out=tmp_path / "q.json",
    )  # fmt: skip
    (row,) = qps["rows"]
    assert row["requests"] == 3 and row["combine_steps"] == 3 and row["decode_tokens"] == 3 * 2
    http = run(
        "http_overhead.py", "--shape", "tiny:qwen3_5_text", "--device", "cpu", "--dtype", "float32",
        "--seg-len", "24", "--segments", "2", "--pool", "4", "--requests", "3", "--rate", "20", "--max-tokens", "2",
        out=tmp_path / "h.json",
    )  # fmt: skip
    assert [r["path"] for r in http["rows"]] == ["direct", "http", "direct again", "http again"]
    assert all(r["n"] == 3 for r in http["rows"])


def test_scatter_smoke(tmp_path):
    res = run(
        "scatter.py", "--workers", "1", "2", "--reps", "1", "--doc", "80", "--split", "32", "--stream-layers", "0", "1",
        out=tmp_path / "s.json",
    )  # fmt: skip
    rows = {(r["workers"], r["policy"], r["split"], r.get("stream_layers")): r for r in res["rows"]}
    pooled = {(2, p, 32, k) for p in ("lpt", "round_robin") for k in (0, 1)}
    assert set(rows) == {(1, "in-process", 0, None), (1, "in-process", 32, None)} | pooled
    assert [rows[(1, "in-process", s, None)]["pieces"] for s in (0, 32)] == [1, 3]  # 80 -> 32 + 32 + 16
    assert all(r["cold_ttft_ms"] > 0 for r in rows.values())
    for key in pooled:
        assert rows[key]["failures"] == 0 and rows[key]["transfer_ms_per_entry"] > 0 and rows[key]["pieces"] == 3


@pytest.mark.skipif(not DATA.is_dir(), reason=f"evaluation data not found at {DATA}")
def test_quality_build_prefix_rows(tmp_path):
    """``--build-prefixes``: each fixed-seam hypic row again under the context, the same recompute
    (the context is build-time work), other entries (other logits)."""
    res = run(
        "quality.py", "--model", "tiny:qwen3_5_text", "--smoke", "--datasets", "hotpotqa", "--modes", "hypic",
        "--seams", "--build-prefixes", "template", out=tmp_path / "q.json",
    )  # fmt: skip
    by = {r["config"]: r for r in res["rows"]}
    assert set(by) == {"full_recompute", "hypic w=8", "hypic w=8 ctx=template"}
    assert by["hypic w=8"]["recompute"] == by["hypic w=8 ctx=template"]["recompute"] < 1
    assert by["hypic w=8"]["per_example"]["kl"] != by["hypic w=8 ctx=template"]["per_example"]["kl"]


@pytest.mark.skipif(not DATA.is_dir(), reason=f"evaluation data not found at {DATA}")
def test_quality_build_prefix_with_blend_rows(tmp_path):
    """``--build-prefixes`` with ``--blend-budgets``: the blend row again under the context."""
    res = run(
        "quality.py", "--model", "tiny:qwen3_5_text", "--smoke", "--datasets", "hotpotqa", "--modes", "hypic",
        "--seams", "--blend-budgets", "0.2", "--build-prefixes", "template", out=tmp_path / "q.json",
    )  # fmt: skip
    by = {r["config"]: r for r in res["rows"]}
    assert set(by) == {
        "full_recompute", "hypic w=8", "hypic w=8 ctx=template", "hypic blend b=0.2", "hypic blend b=0.2 ctx=template"
    }  # fmt: skip
    assert by["hypic blend b=0.2"]["per_example"]["kl"] != by["hypic blend b=0.2 ctx=template"]["per_example"]["kl"]


def test_serving_smoke(tmp_path):
    """``serving.py``: runner, scheduler and a real ``hypic-agent serve`` process on loopback, every
    row once with sensible values, the TTFTs, start-up stages and idle modes, the server log kept."""
    res = run(
        "serving.py", "--shape", "tiny:qwen3_5_text", "--device", "cpu", "--dtype", "float32", "--batches", "1", "2",
        "--contexts", "64", "--decode-tokens", "8", "--ttft-reps", "2", "--idle-warmup", "1", "--idle-reps", "2",
        "--prefill-reps", "1", out=tmp_path / "s.json",
    )  # fmt: skip
    keys = [(r["path"], r["batch"], r["context"]) for r in res["rows"]]
    assert sorted(keys) == sorted((p, b, 64) for p in ("runner", "scheduler", "http") for b in (1, 2))
    for r in res["rows"]:
        assert r["tokens_per_s"] > 0 and r["tpot_p50_ms"] > 0, r
        if r["path"] == "runner":
            assert r["window_tokens"] == 8 * r["batch"]
        else:  # counted only once every request had its first token: no prefill in those steps
            assert r["prefill_tokens_in_window"] == 0 and r["window_tokens"] >= 2 and r["ramp_s"] > 0, r
    assert res["first_request_ttft_ms"] > 0 and res["steady_ttft_ms"] > 0 and len(res["steady_ttft_all_ms"]) == 2
    assert 0 < res["startup_s"] < 600 and res["startup_stages"][-1]["msg"] == "listening"
    assert set(res["idle_ttft_ms"]) == {"full_recompute", "prefix_cache", "hypic"}
    assert all(v > 0 for v in res["idle_ttft_ms"].values())
    assert all(u["prompt_tokens"] == 64 for u in res["idle_usage"].values())
    assert res["idle_usage"]["hypic"]["cached_tokens"] > 0  # the idle hypic requests were warm
    assert res["prefill_ms"]["64"] > 0 and res["device"] == "cpu"
    assert {c["check"] for c in res["checks"]} >= {
        "first request TTFT / steady TTFT",
        "start-up s (spawn -> listening)",
    }
    assert '"listening"' in (tmp_path / "s.server.log").read_text()
