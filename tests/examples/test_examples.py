"""The runnable examples, each as a subprocess in smoke mode against ONE real server process.

The server is ``python -m hypic_agent.cli serve --model tiny:qwen3_5_text`` on a free loopback
port with HYPIC_HOME in a temp dir and an API key required (so ``--api-key`` is exercised). The
tiny model's answers are noise: success is exit code 0, the result table and the ``OK`` line
(non-empty answers, no server error, cache reuse where the example checks it). The HotpotQA and
Multi-News examples skip when ``<repo>/../shared/data`` is missing.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
DATA = ROOT.parent / "shared" / "data"
TINY = "tiny:qwen3_5_text"
KEY = "sk-examples-test"

sys.path.insert(0, str(EXAMPLES))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    home = tmp_path_factory.mktemp("examples-home")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "HYPIC_HOME": str(home),
        "HYPIC_DEVICE": "cpu",
        "HYPIC_API_KEYS": json.dumps({KEY: "examples"}),
        "PYTHONPATH": str(ROOT),
        # one math thread: on a busy shared box, OpenMP threads spin-waiting for a descheduled
        # sibling turned ~0.2 s of server CPU per example into 10-20 s
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    log_path = home / "server.log"
    cmd = [sys.executable, "-m", "hypic_agent.cli", "serve", "--model", TINY, "--port", str(port)]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 90
            while True:
                if proc.poll() is not None:
                    pytest.fail(f"server exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
                if time.monotonic() > deadline:
                    pytest.fail(f"server did not come up:\n{log_path.read_text()[-3000:]}")
                try:
                    if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.2)
            yield url
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def run_example(name: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python examples/<name>.py ARGS`` from a neutral cwd (the examples find the SDK themselves)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, str(EXAMPLES / f"{name}.py"), *args],
        cwd=EXAMPLES.parent.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def smoke(name: str, url: str, *extra: str) -> str:
    proc = run_example(name, "--url", url, "--api-key", KEY, "--smoke", *extra)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "FAILED" not in out, out
    return proc.stdout


def needs_data(filename: str) -> None:
    if not (DATA / filename).is_file():
        pytest.skip(f"{DATA / filename} is missing (shared evaluation data not on this machine)")


def test_quickstart(server: str) -> None:
    out = smoke("quickstart", server)
    assert "ttft_ms" in out and "cached" in out
    table_rows = [line for line in out.splitlines() if line.strip()[:1] in "123" and ">" in line]
    assert len(table_rows) == 3, out
    assert "OK quickstart: 3 calls, ttft" in out


def test_rag_hotpotqa(server: str) -> None:
    needs_data("hotpotqa_dev.jsonl")
    out = smoke("rag_hotpotqa", server, "--limit", "1")
    assert "F1_reord" in out and "dataset order:  F1" in out and "reversed order: F1" in out
    assert "OK rag_hotpotqa: 1 questions" in out


def test_summarize_multinews(server: str) -> None:
    needs_data("multinews_longbench.jsonl")
    out = smoke("summarize_multinews", server, "--limit", "1")
    assert "ROUGE-L_reord" in out and "reversed order: ROUGE-L" in out
    assert "OK summarize_multinews: 1 clusters" in out


def test_agent_memory(server: str) -> None:
    out = smoke("agent_memory", server)
    assert "recomputed segments" in out and "final memory: 2 profile facts, 3 log lines, 6 turns" in out
    assert "OK agent_memory: 3 steps" in out


def test_agent_tools(server: str) -> None:
    out = smoke("agent_tools", server)
    assert "OK agent_tools: 2 tasks" in out and " 0 tool calls" not in out
    assert "of prompt tokens cached" in out


def test_langchain_rag(server: str) -> None:
    pytest.importorskip("langchain_core")
    out = smoke("langchain_rag", server)
    assert "cache_read" in out and "OK langchain_rag: 2 questions" in out


def test_llamaindex_rag(server: str) -> None:
    pytest.importorskip("llama_index.core")
    out = smoke("llamaindex_rag", server)
    assert "prompt_tokens" in out and "OK llamaindex_rag: 2 questions" in out


def test_server_error_exits_loudly(server: str) -> None:
    proc = run_example("quickstart", "--url", server, "--api-key", "sk-wrong", "--smoke")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "FAILED: server returned HTTP 401" in proc.stderr


def test_unreachable_server_exits_loudly() -> None:
    proc = run_example("agent_memory", "--url", f"http://127.0.0.1:{free_port()}", "--smoke", timeout=60)
    assert proc.returncode == 2 and "cannot reach the server" in proc.stderr


def test_missing_data_skips_cleanly(tmp_path: Path) -> None:
    for name in ("rag_hotpotqa", "summarize_multinews"):
        proc = run_example(name, "--data", str(tmp_path / "nowhere"), "--smoke", timeout=60)
        assert proc.returncode == 0 and proc.stdout.startswith("SKIP:"), proc.stdout + proc.stderr


def test_empty_answer_is_a_failure() -> None:
    from _common import ExampleFailure, require_answer

    with pytest.raises(ExampleFailure, match="empty answer for step 1"):
        require_answer("  \n", "step 1")
    with pytest.raises(ExampleFailure):
        require_answer("", "x", smoke=True)
    assert require_answer("\n", "x", smoke=True) == "\n"  # tiny-model noise passes in smoke mode
    assert require_answer(" Paris. ", "x") == "Paris."


def test_metrics() -> None:
    from _metrics import contains_answer, exact_match, f1, rouge_l

    assert exact_match("The Chief of Protocol.", ["Chief of Protocol"]) == 1.0
    assert f1("chief of the protocol office", ["Chief of Protocol"]) == pytest.approx(2 * 0.75 / 1.75)  # P 3/4, R 1
    assert f1("nothing", ["Animorphs"]) == 0.0
    assert contains_answer("It is the Animorphs series.", ["Animorphs"]) == 1.0
    assert contains_answer("Animorphism", ["Animorphs"]) == 0.0
    # LCS("a b c d", "a c d e") = 3 -> P = R = 3/4
    assert rouge_l("a b c d", ["x", "a c d e"]) == pytest.approx(0.75)
    assert rouge_l("", ["a"]) == 0.0
