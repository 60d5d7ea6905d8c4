"""``hypic-agent generate``: arguments checked before any load, local runs with segments and a mode,
``--url`` against a running server (whose cache serves the second call)."""

from __future__ import annotations

import errno
import logging
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from hypic_agent.cli import app
from hypic_agent.config import Settings

TINY = "tiny:qwen3_5_text"
PARIS = "Paris is the capital and largest city of France. It lies on the Seine, in the north of the country."
LYON = "Lyon is the third-largest city of France. It stands where the Rhone and the Saone meet; silk made it rich."
USAGE = re.compile(r"(\d+) tokens in [\d.]+ s .*prompt (\d+) tokens: (\d+) cached, (\d+) recomputed; mode (\w+)")


@pytest.fixture
def files(tmp_path: Path) -> list[Path]:
    out = []
    for name, text in (("paris.txt", PARIS), ("lyon.txt", LYON)):
        (tmp_path / name).write_text(text)
        out.append(tmp_path / name)
    return out


@pytest.fixture
def no_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any model load fails the test: bad arguments must be caught before."""
    import hypic_agent.runtime.loader as loader

    def boom(*a: Any, **k: Any) -> None:
        raise AssertionError("load_engine called for bad arguments")

    monkeypatch.setattr(loader, "load_engine", boom)


def invoke(*args: str, home: Path | None = None) -> Any:
    env = {"HYPIC_HOME": str(home)} if home else {}
    return CliRunner().invoke(app, ["generate", *args], env={**env, "COLUMNS": "300"})


BAD = [
    (["--mode", "bogus"], "--mode 'bogus' is not a mode; use one of full_recompute"),
    (["--seam", "-1"], "--seam -1.0: use 0"),
    (["--seam", "2.5"], "--seam 2.5: use 0"),
    (["--seam", "wide"], "--seam 'wide': use 0 (none), a fraction in (0, 1], a token count, or auto"),
    (["--segment", "/no/such/file.txt"], "--segment /no/such/file.txt: no such file"),
    (["--segment", "{paris}", "--kind", "turn"], "--kind 'turn' is not a segment kind for a file"),
    (["--segment", "{paris}", "--kind", "document", "--kind", "skill", "--kind", "memory"], "3 --kind values for 1"),
    (["--kind", "document"], "--kind applies to --segment files"),
    (["--url", "localhost:8000"], "is not an http(s) URL"),
    (["--url", "http://127.0.0.1:1", "--model", TINY], "--model: only for a local run"),
    (["--raw", "--mode", "hypic"], "--raw completes the prompt text alone"),
    (["--model", "no-such-model"], "unknown model 'no-such-model'"),
    (["--max-tokens", "0"], "--max-tokens"),
]


@pytest.mark.parametrize(("args", "message"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_arguments_fail_fast_before_loading(
    args: list[str], message: str, files: list[Path], no_load: None, tmp_path: Path
) -> None:
    args = [a.replace("{paris}", str(files[0])) for a in args]
    res = invoke("-p", "What is the capital of France?", *args, home=tmp_path)  # no_load: nothing loads
    assert res.exit_code == 2, res.output
    assert message in " ".join(res.output.split()), res.output


def test_local_run_sends_segments_with_mode(
    files: list[Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The real tiny load (start-up lines in the log), two files as segments, mode and seam honoured."""
    caplog.set_level(logging.INFO, logger="hypic.startup")
    res = invoke("-p", "Which city is the capital?", "--model", TINY, "--device", "cpu", "--segment", str(files[0]),
                 "--segment", str(files[1]), "--kind", "document", "--kind", "memory", "--mode", "transition",
                 "--seam", "4", "--max-tokens", "3", home=tmp_path)  # fmt: skip
    assert res.exit_code == 0, res.output
    lines = [r.getMessage() for r in caplog.records if r.name == "hypic.startup"]
    assert lines[0].startswith("reading the weights of tiny:qwen3_5_text") and "start-up took" in lines[-1], lines
    m = USAGE.search(res.output)
    assert m is not None, res.output
    completion, prompt, cached, recomputed = map(int, m.groups()[:4])
    assert m.group(5) == "transition" and 1 <= completion <= 3
    # the byte tokenizer: both files and the question are in the prompt (plus framing)
    assert prompt > len(PARIS) + len(LYON) + len("Which city is the capital?")
    assert cached == 0 and recomputed == prompt  # one call, a fresh store: nothing was cached yet


def test_raw_local_run(tmp_path: Path) -> None:
    res = invoke("-p", "def f(x):", "--model", TINY, "--raw", "--max-tokens", "2", home=tmp_path)
    assert res.exit_code == 0, res.output
    assert re.search(r"\d+ tokens in [\d.]+ s .*prompt 9 tokens, raw", res.output), res.output


@pytest.fixture
def no_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    """``import hypic_client`` fails, as after README command 1 without ``-e ./sdk/python``."""
    import sys

    for name in [m for m in sys.modules if m == "hypic_client" or m.startswith("hypic_client.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "hypic_client", None)  # a None entry makes the import raise ImportError


def test_local_run_needs_no_sdk(no_sdk: None, files: list[Path], tmp_path: Path) -> None:
    """``generate`` works from the server's own install: the Python SDK is not a dependency."""
    with pytest.raises(ImportError):
        import hypic_client  # noqa: F401
    res = invoke("-p", "Which city?", "--model", TINY, "--device", "cpu", "--segment", str(files[0]),
                 "--max-tokens", "2", home=tmp_path)  # fmt: skip
    assert res.exit_code == 0, res.output
    m = USAGE.search(res.output)
    assert m is not None and m.group(5) == "hypic", res.output
    assert int(m.group(2)) > len(PARIS) and int(m.group(3)) == 0


def test_sse_payloads_reads_the_servers_framing() -> None:
    from hypic_agent.cli_generate import ServerError, sse_payloads

    lines = [
        ": ping",
        'data: {"text": "a"}',
        "",
        'data: {"text":',
        'data: "b"}',
        "",
        "data: [DONE]",
        "",
        'data: {"x": 1}',
    ]
    assert list(sse_payloads(lines)) == [{"text": "a"}, {"text": "b"}]  # multi-line data joined; [DONE] ends it
    assert list(sse_payloads(['data: {"text": "c"}'])) == [{"text": "c"}]  # no closing blank line
    with pytest.raises(ServerError, match="not JSON"):
        list(sse_payloads(["data: oops", ""]))


# ---------------------------------------------------------------------------- --url
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The real app over the tiny model, served by uvicorn on a free loopback port in a thread."""
    import uvicorn

    from hypic_agent.api import create_app
    from hypic_agent.runtime.loader import load_engine

    home = tmp_path_factory.mktemp("server-home")
    settings = Settings(home=home, device="cpu", model=TINY)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(create_app(settings, engine=load_engine(settings)), port=port, log_config=None)
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not srv.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(timeout=30)


def test_url_run_uses_the_servers_cache(server: str, files: list[Path], no_load: None) -> None:
    """No model load here; the second call with the same files is served from the server's cache."""
    args = ["-p", "Which city is the capital?", "--url", server, "--max-tokens", "2"]
    args += ["--segment", str(files[0]), "--segment", str(files[1])]
    first, second = invoke(*args), invoke(*args)
    assert first.exit_code == 0 and second.exit_code == 0, (first.output, second.output)
    u1, u2 = USAGE.search(first.output), USAGE.search(second.output)
    assert u1 is not None and u2 is not None, (first.output, second.output)
    assert int(u1.group(2)) == int(u2.group(2)) > len(PARIS) + len(LYON)
    assert int(u1.group(3)) == 0 and u1.group(5) == "hypic"
    # both documents hit: all their tokens but the 8-token seam at each one's start are served from cache
    assert int(u2.group(3)) >= len(PARIS) + len(LYON) - 2 * 8 - 2, second.output


def test_url_run_needs_no_sdk(server: str, files: list[Path], no_load: None, no_sdk: None) -> None:
    res = invoke("-p", "Which city is the capital?", "--url", server, "--max-tokens", "2", "--segment", str(files[1]))
    assert res.exit_code == 0, res.output
    m = USAGE.search(res.output)
    assert m is not None and int(m.group(2)) > len(LYON), res.output


def test_url_error_answer_says_what_the_server_said(server: str, no_load: None) -> None:
    """A 4xx from the server: its error type and message, exit code 1 (here: max_tokens over the limit)."""
    res = invoke("-p", "hi", "--url", server, "--max-tokens", "100000")
    assert res.exit_code == 1, res.output
    out = " ".join(res.output.split())
    assert "error (" in out and "max_tokens" in out, res.output


def test_url_unreachable_says_so(no_load: None) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    res = invoke("-p", "hi", "--url", f"http://127.0.0.1:{port}")
    assert res.exit_code == 1
    assert f"cannot reach a server at http://127.0.0.1:{port}" in " ".join(res.output.split())


# ---------------------------------------------------------------------------- serve
def test_serve_start_up_log_reads_well_in_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a terminal: JSON lines that say each stage, the pre-warm count and the total time; no bars."""
    import json

    import uvicorn

    async def stop_at_once(self: Any) -> None:  # start-up only: the server starts, then stops
        pass

    monkeypatch.setattr(uvicorn.Server, "main_loop", stop_at_once)
    prewarm = tmp_path / "prewarm.json"
    prewarm.write_text(json.dumps([{"kind": "document", "text": PARIS}, {"kind": "document", "text": LYON}]))
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        res = CliRunner().invoke(
            app, ["serve", "--model", TINY, "--device", "cpu", "--prewarm", str(prewarm)],
            env={"HYPIC_HOME": str(tmp_path / "home"), "HYPIC_PORT": "0"},
        )  # fmt: skip
    finally:
        root.handlers[:], root.level = saved
    assert res.exit_code == 0, res.output
    assert "\r" not in res.output
    lines = [json.loads(line) for line in res.output.splitlines() if line.startswith("{")]
    msgs = [line["msg"] for line in lines]
    listening = lines[msgs.index("listening")]
    assert listening["host"] == "127.0.0.1" and listening["port"] > 0  # port 0: the free port it got
    assert listening["url"] == f"http://127.0.0.1:{listening['port']}"
    startup = [line["msg"] for line in lines[: msgs.index("listening")] if line["logger"] == "hypic.startup"]
    assert startup[0] == f"starting: model {TINY}, home {tmp_path / 'home'}"
    assert startup[1].startswith(f"reading the weights of {TINY} (tiny)")
    assert "pre-warming 2 segments: 2 segments of 2 segments (100%)" in startup
    assert startup[-1].startswith(f"model {TINY} ready, 2 stored entries (start-up took ")


def test_serve_on_a_busy_port_fails_before_loading(no_load: None, tmp_path: Path) -> None:
    """Another process listens on the port: a clear error and exit code 2 before any model load (the
    ``no_load`` fixture fails the test if a load starts), and no "listening" line."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = CliRunner().invoke(
            app, ["serve", "--model", TINY, "--device", "cpu", "--port", str(port)],
            env={"HYPIC_HOME": str(tmp_path)},
        )  # fmt: skip
    assert res.exit_code == 2, res.output
    out = " ".join(res.output.split())
    assert f"port {port} on 127.0.0.1 is already in use" in out and "--port N (or HYPIC_PORT)" in out, res.output
    assert "listening" not in res.output


@pytest.mark.parametrize("engine_process", ["false", "auto"])
def test_serve_holds_its_port_from_the_check_to_serving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine_process: str
) -> None:
    """The port is bound before the model load and that socket is the one served on: during the load
    no other process can bind it (not even with SO_REUSEADDR, as a second ``serve`` would), nothing
    answers on it yet, and the server then serves on that very port. ``auto``: the load happens in the
    engine process (``HYPIC_ENGINE_PROCESS``), checked while this process starts it."""
    import json

    import uvicorn

    import hypic_agent.runtime.loader as loader
    from hypic_agent.runtime.core_process import EngineClient

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    during_load: dict[str, Any] = {}
    real_load = loader.load_engine

    def check() -> None:
        from hypic_agent.startup import port_problem

        during_load["problem"] = port_problem("127.0.0.1", port)
        with socket.socket() as other:
            other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                other.bind(("127.0.0.1", port))
                during_load["bind"] = "bound"
            except OSError as e:
                during_load["bind"] = e.errno
        with socket.socket() as probe:
            during_load["connect"] = probe.connect_ex(("127.0.0.1", port))

    def load(settings: Settings, **kw: Any) -> Any:
        check()
        return real_load(settings, **kw)

    served: list[int] = []

    async def stop_at_once(self: Any) -> None:
        served.extend(sock.getsockname()[1] for server in self.servers for sock in server.sockets)

    if engine_process == "false":
        monkeypatch.setattr(loader, "load_engine", load)
    else:
        real_start = EngineClient.start

        def start(settings: Settings, **kw: Any) -> Any:
            client = real_start(settings, **kw)
            check()  # the engine process loaded its model: the port is still held, not served
            return client

        monkeypatch.setattr(EngineClient, "start", start)
    monkeypatch.setattr(uvicorn.Server, "main_loop", stop_at_once)
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        res = CliRunner().invoke(
            app, ["serve", "--model", TINY, "--device", "cpu", "--port", str(port)],
            env={"HYPIC_HOME": str(tmp_path), "HYPIC_ENGINE_PROCESS": engine_process},
        )  # fmt: skip
    finally:
        root.handlers[:], root.level = saved
    assert res.exit_code == 0, res.output
    assert "already in use" in (during_load["problem"] or ""), during_load
    assert during_load["bind"] == errno.EADDRINUSE and during_load["connect"] == errno.ECONNREFUSED, during_load
    assert served == [port]
    lines = [json.loads(line) for line in res.output.splitlines() if line.startswith("{")]
    assert [line["port"] for line in lines if line["msg"] == "listening"] == [port]
    from hypic_agent.startup import port_problem

    assert port_problem("127.0.0.1", port) is None  # released once the server stopped


def test_listening_is_logged_once_the_server_accepts(tmp_path: Path) -> None:
    """ "listening" is logged when a TCP connect to the port succeeds, not before: a connect at the
    moment of the log line (from the log handler itself) is accepted, one before the server ran was
    refused, and the server answers a request after it."""
    import httpx

    from hypic_agent.api import create_app
    from hypic_agent.api.serve import make_server
    from hypic_agent.runtime.loader import load_engine
    from hypic_agent.startup import hold_port

    settings = Settings(home=tmp_path, device="cpu", model=TINY, port=0)
    sock = hold_port("127.0.0.1", 0)
    port = sock.getsockname()[1]
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) == errno.ECONNREFUSED  # held, not listening yet
    seen: list[tuple[str, int]] = []
    logged = threading.Event()

    class AtListening(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage() != "listening":
                return
            with socket.socket() as s:
                seen.append(("listening", s.connect_ex(("127.0.0.1", port))))
            logged.set()

    serve_log = logging.getLogger("hypic.serve")
    handler = AtListening()
    serve_log.addHandler(handler)
    saved_level = serve_log.level
    serve_log.setLevel(logging.INFO)
    server = make_server(create_app(settings, engine=load_engine(settings)), settings, sock, log_level="warning")
    thread = threading.Thread(target=server.run, daemon=True)
    try:
        thread.start()
        assert logged.wait(120), "no 'listening' line"
        assert seen == [("listening", 0)]  # accepted at the moment it said so
        assert server.started
        r = httpx.get(f"http://127.0.0.1:{port}/health", timeout=30)
        assert r.status_code == 200 and r.json()["status"] == "ok"
    finally:
        server.should_exit = True
        thread.join(30)
        serve_log.removeHandler(handler)
        serve_log.setLevel(saved_level)
        sock.close()
    assert not thread.is_alive()


def test_port_problem_names_the_cause() -> None:
    from hypic_agent.startup import port_problem

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert "already in use" in (port_problem("127.0.0.1", port) or "")
    assert port_problem("127.0.0.1", port) is None  # free again once the listener is gone
    assert port_problem("127.0.0.1", 0) is None
    assert "cannot listen on 192.0.2.1" in (port_problem("192.0.2.1", port) or "")  # not an address of this host


def test_serve_missing_prewarm_file_fails_before_loading(no_load: None, tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["serve", "--prewarm", str(tmp_path / "absent.json")])
    assert res.exit_code == 2 and "no such file" in res.output


def test_serve_rejects_bad_scatter_devices_at_start_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYPIC_HOME", str(tmp_path))
    args = ["serve", "--model", TINY, "--device", "cpu", "--scatter-workers", "2", "--devices", "cuda:0,cuda:1"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2
    assert "scatter workers:" in res.output and "rank 0's kind (cpu)" in res.output


def test_seam_auto_and_numbers_parse():
    from hypic_agent.cli_generate import check_request

    common: dict[str, Any] = dict(prompt="q", files=[], kinds=[], mode="hypic", url=None, raw=False, local_only={})
    assert check_request(seam="auto", **common).seam == "auto"
    assert check_request(seam="8", **common).seam == 8.0


def test_serve_split_segment_tokens_reaches_the_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hypic_agent.api import serve as serve_mod

    seen: list[Any] = []
    monkeypatch.setattr(serve_mod, "run_server", lambda settings, **kw: seen.append(settings))
    monkeypatch.setenv("HYPIC_HOME", str(tmp_path))
    monkeypatch.setenv("HYPIC_PORT", "0")
    res = CliRunner().invoke(app, ["serve", "--model", TINY, "--device", "cpu", "--split-segment-tokens", "512"])
    assert res.exit_code == 0, res.output
    assert seen[0].split_segment_tokens == 512 and seen[0].model == TINY
    bad = CliRunner().invoke(app, ["serve", "--split-segment-tokens", "-1"])
    assert bad.exit_code == 2  # refused by the option itself, before anything loads
