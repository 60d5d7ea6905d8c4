"""End to end: the real ``hypic-agent serve`` process on a free loopback port.

Segment requests, reordering (cached_tokens rise), a client that hangs up mid-stream, the SDK
against the live server, then a restart over the same HYPIC_HOME that still hits the disk tier.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.api.conftest import BERLIN, PARIS, ROME, TINY, doc

ROOT = Path(__file__).resolve().parents[2]
SYSTEM = {"kind": "system", "text": "You answer from the documents, briefly and exactly."}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, home: Path, log: Path) -> None:
        self.home, self.log_path = home, log
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 90.0) -> Server:
        env = {**os.environ, "HYPIC_HOME": str(self.home), "HYPIC_DEVICE": "cpu", "PYTHONPATH": str(ROOT)}
        cmd = [sys.executable, "-m", "hypic_agent.cli", "serve", "--model", TINY, "--port", str(self.port)]
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"server exited with {self.proc.returncode}:\n{self.log_path.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                time.sleep(0.2)
        self.stop()
        pytest.fail(f"server did not come up:\n{self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def generate(http: httpx.Client, segments, query="Which capital?", **kw):
    r = http.post("/v1/generate", json={"segments": segments, "query": query, "max_tokens": 3, **kw})
    assert r.status_code == 200, r.text
    return r.json()["usage"]


def test_real_server_reorder_hangup_sdk_and_restart_hits_disk(tmp_path):
    server = Server(tmp_path / "home", tmp_path / "server.log").start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            [rome] = http.put("/v1/segments", json={"segments": [doc(ROME, "Rome")]}).json()["data"]
            cold = generate(http, [SYSTEM, doc(PARIS), doc(BERLIN)])
            assert cold["cached_tokens"] == 0
            warm = generate(http, [SYSTEM, doc(BERLIN), doc(PARIS), {"id": rome["id"]}])  # reordered + stored id
            assert warm["cached_tokens"] > cold["cached_tokens"]
            assert all(s["hit"] for s in warm["segments"])

            # a client that hangs up mid-stream: the server stops, stays healthy, store intact
            body = {"segments": [doc(PARIS)], "query": "Tell me everything.", "max_tokens": 400, "stream": True}
            with http.stream("POST", "/v1/generate", json=body) as r:
                assert r.status_code == 200
                next(r.iter_lines())
            t0 = time.monotonic()
            again = generate(http, [doc(PARIS)])
            assert again["segments"][0]["hit"] and time.monotonic() - t0 < 20

            sys.path.insert(0, str(ROOT / "sdk" / "python"))
            from hypic_client import Hypic, ref
            from hypic_client import doc as sdk_doc

            with Hypic(server.url, max_retries=0) as sdk:
                resp = sdk.generate([ref(rome["id"]), sdk_doc(PARIS)], "q?", stream=True, max_tokens=2).final_response()
                assert resp.usage.cached_tokens > 0 and resp.finish_reason
                assert any(s.id == rome["id"] for s in sdk.segments.list(limit=100))
                assert sdk.chat.completions.create(messages=[{"role": "user", "content": "hi"}], max_tokens=2).usage
        metrics = httpx.get(f"{server.url}/metrics").text
        assert "hypic_ttft_seconds_count" in metrics
    finally:
        server.stop()
    # graceful: the lifespan ran its shutdown (uvicorn then re-raises SIGTERM: -15)
    assert server.proc.returncode in (0, -signal.SIGTERM), server.log_path.read_text()[-2000:]
    assert '"msg": "server stopped"' in server.log_path.read_text()

    server = Server(tmp_path / "home", tmp_path / "server2.log").start()  # restart, same home
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            usage = generate(http, [SYSTEM, doc(PARIS), doc(BERLIN), {"id": rome["id"]}])
            assert usage["cached_tokens"] > 0
            assert [s["tier"] for s in usage["segments"]] == ["disk"] * 4
            assert http.get(f"/v1/segments/{rome['id']}").json()["title"] == "Rome"
    finally:
        server.stop()
    log = (tmp_path / "server.log").read_text()
    assert '"msg": "server ready"' in log and "tiny random model" in log
