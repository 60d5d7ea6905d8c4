"""``hypic-agent generate``: one completion from the command line, with segments and a mode.

Every argument is checked before anything is loaded (``check_request``: mode, seam, sampling,
segment files and kinds, URL), so a bad one fails in well under a second. Then:

* ``--url URL``: the request goes to a running server (``POST /v1/generate``, streamed, over httpx):
  no model load, and the server's segment cache serves repeated segments (``cached_tokens``);
* otherwise the model is loaded here (start-up progress on stderr) and the server's own app runs
  in-process behind the same HTTP calls (its test client), with a throw-away segment store;
* ``--raw`` (local only, no segments): complete the prompt text as is, without the chat template.

Only the server's dependencies are needed (httpx, fastapi): not the Python SDK (``hypic_client``).
The completion streams to stdout; usage and timings go to stderr (``usage_line``).
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from hypic_agent.config import MODES, Settings

# segment kinds a file can be (a ``turn`` carries chat messages, not a file's text)
FILE_KINDS: tuple[str, ...] = ("document", "system", "skill", "memory", "text")


class BadArgument(ValueError):
    """A command-line argument that cannot work; the message says which and why."""


@dataclass(frozen=True)
class GenerateRequest:
    prompt: str
    segments: tuple[dict[str, Any], ...] = ()
    mode: str | None = None
    seam: float | str | None = None  # a width, or "auto"
    max_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    def body(self) -> dict[str, Any]:
        """The JSON body of a streamed ``POST /v1/generate`` (unset mode / seam: the server's defaults)."""
        body = dict(
            segments=list(self.segments), query=self.prompt, mode=self.mode, seam=self.seam,
            max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
        )  # fmt: skip
        return {k: v for k, v in body.items() if v is not None} | {"stream": True}


def read_segments(files: list[Path], kinds: list[str]) -> tuple[dict[str, Any], ...]:
    """One wire segment per file: ``--kind`` once for all files, or once per file in order."""
    if kinds and not files:
        raise BadArgument("--kind applies to --segment files; give at least one --segment FILE")
    if len(kinds) not in (0, 1, len(files)):
        raise BadArgument(
            f"{len(kinds)} --kind values for {len(files)} --segment files: give one --kind for all "
            "files, or one per file in the same order"
        )
    for k in kinds:
        if k not in FILE_KINDS:
            raise BadArgument(f"--kind {k!r} is not a segment kind for a file; use one of {', '.join(FILE_KINDS)}")
    per_file = kinds * len(files) if len(kinds) == 1 else kinds or ["document"] * len(files)
    out = []
    for path, kind in zip(files, per_file, strict=True):
        if not path.is_file():
            raise BadArgument(f"--segment {path}: no such file")
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise BadArgument(f"--segment {path}: cannot read it as UTF-8 text ({e})") from e
        if not text.strip():
            raise BadArgument(f"--segment {path}: the file is empty")
        out.append({"kind": kind, "text": text, "title": path.name})
    return tuple(out)


def check_request(
    *,
    prompt: str,
    files: list[Path],
    kinds: list[str],
    mode: str | None,
    seam: float | str | None,
    url: str | None,
    raw: bool,
    local_only: dict[str, Any],
    **sampling: Any,
) -> GenerateRequest:
    """Validate everything that can be checked without a model; ``BadArgument`` otherwise."""
    if not prompt.strip():
        raise BadArgument("--prompt is empty")
    if mode is not None and mode not in MODES:
        raise BadArgument(f"--mode {mode!r} is not a mode; use one of {', '.join(MODES)}")
    if isinstance(seam, str) and seam != "auto":
        try:
            seam = float(seam)
        except ValueError:
            raise BadArgument(f"--seam {seam!r}: use 0 (none), a fraction in (0, 1], a token count, or auto") from None
    if isinstance(seam, float | int) and (not math.isfinite(seam) or seam < 0 or (seam > 1 and seam != int(seam))):
        raise BadArgument(f"--seam {seam}: use 0 (none), a fraction in (0, 1], or a whole number of tokens > 1")
    if url is not None:
        if not url.startswith(("http://", "https://")):
            raise BadArgument(f"--url {url!r} is not an http(s) URL, e.g. http://127.0.0.1:8000")
        given = [f"--{k}" for k, v in {**local_only, "raw": raw}.items() if v]
        if given:
            raise BadArgument(f"{', '.join(given)}: only for a local run, not with --url")
    if raw and (files or mode or seam is not None):
        raise BadArgument("--raw completes the prompt text alone: no --segment, --mode or --seam with it")
    segments = read_segments(files, kinds)
    return GenerateRequest(prompt=prompt, segments=segments, mode=mode, seam=seam, **sampling)


def check_model(settings: Settings) -> None:
    """An unknown model name or a missing path fails here, before the load (a catalog model that
    is not downloaded yet is fine: the load fetches it; tiny:<arch> is checked by the load)."""
    from hypic_agent.runtime.models.loading.catalog import BUNDLED, CATALOG, resolve_model

    name = settings.model.strip()
    if name in CATALOG or name in BUNDLED or name == "tiny" or name.startswith("tiny:"):
        return
    resolve_model(name, settings, fetch=False)


class ServerError(Exception):
    """The server answered an error: a status other than 200, or an error event in the stream."""

    def __init__(self, message: str, kind: str = "", status: int | None = None) -> None:
        super().__init__(message)
        self.message, self.kind, self.status = message, kind, status

    @classmethod
    def of_payload(cls, payload: Any, status: int | None) -> ServerError:
        """From the API's error body ``{"error": {"type", "message", "param"}}`` (or anything else)."""
        err = payload.get("error") if isinstance(payload, dict) else None
        if isinstance(err, dict):
            param = f" (param {err['param']})" if err.get("param") else ""
            return cls(
                f"{err.get('message') or 'the server reported an error'}{param}", str(err.get("type") or ""), status
            )
        return cls(f"the server answered {status}: {str(payload)[:300]}", "", status)


def transport_error_message(e: Exception, url: str | None) -> str:
    """What went wrong talking to the server, in words (an unreachable ``--url`` says so)."""
    import httpx

    if isinstance(e, httpx.TimeoutException):
        return f"the server at {url or 'in-process'} did not answer in time ({e})"
    if isinstance(e, httpx.TransportError) and url is not None:
        return f"cannot reach a server at {url} ({e}); is `hypic-agent serve` running there?"
    return f"{type(e).__name__}: {e}"


# ---------------------------------------------------------------------------- clients
@contextmanager
def remote_client(url: str, api_key: str | None) -> Iterator[Any]:
    """An httpx client for the server at ``url`` (bearer ``api_key``); a long read timeout: a cold
    request on CPU can take minutes before its first token."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(base_url=url, headers=headers, timeout=httpx.Timeout(600.0, connect=10.0)) as client:
        yield client


_RECOMPUTED = ("content-length", "content-encoding", "transfer-encoding")


def _in_process(test_client: Any) -> Any:
    """An httpx transport that hands each request to an in-process ASGI test client."""
    import httpx

    class InProcess(httpx.BaseTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            # by method, URL and bytes: the test client may be built on another httpx (starlette's: httpx2)
            r = test_client.request(request.method, str(request.url), headers=request.headers, content=request.read())
            headers = [(k, v) for k, v in r.headers.multi_items() if k.lower() not in _RECOMPUTED]
            return httpx.Response(r.status_code, headers=headers, content=r.content, request=request)

    return InProcess()


@contextmanager
def local_client(settings: Settings, engine: Any) -> Iterator[Any]:
    """The server's app over this process's engine, with a segment store in a temporary folder, behind
    an httpx client: the same calls (and errors) as against a server."""
    import httpx
    from fastapi.testclient import TestClient

    from hypic_agent.api.app import create_app

    with tempfile.TemporaryDirectory(prefix="hypic-generate-") as tmp:
        db = f"sqlite:///{Path(tmp) / 'registry.sqlite3'}"
        app = create_app(settings.model_copy(update={"store_dir": Path(tmp) / "store", "database_url": db}), engine)
        with (
            TestClient(app, raise_server_exceptions=False) as tc,
            httpx.Client(base_url="http://in-process", transport=_in_process(tc), timeout=600.0) as client,
        ):
            yield client


def sse_payloads(lines: Iterable[str]) -> Iterator[Any]:
    """The JSON payloads of a server-sent event stream (``data:`` lines up to a blank line form one
    event; comments skipped), up to ``data: [DONE]``."""
    data: list[str] = []
    for raw in _with_end(lines):
        line = raw.rstrip("\r\n")
        if line.startswith(":"):
            continue
        if line:
            name, _, value = line.partition(":")
            if name == "data":
                data.append(value.removeprefix(" "))
            continue
        if not data:
            continue
        text, data = "\n".join(data), []
        if text.strip() == "[DONE]":
            return
        try:
            yield json.loads(text)
        except ValueError:
            raise ServerError(f"the server sent a stream event that is not JSON: {text[:200]!r}") from None


def _with_end(lines: Iterable[str]) -> Iterator[str]:
    yield from lines
    yield ""  # a last event without its blank line is still dispatched


# ---------------------------------------------------------------------------- output
def usage_line(final: dict[str, Any], seconds: float) -> str:
    """``5 tokens in 1.2 s (ttft 300 ms, finish=length); prompt 127 tokens: 87 cached, 40 recomputed; mode hypic``."""
    u, t = final.get("usage") or {}, final.get("timings") or {}
    ttft = f"ttft {t['ttft_ms']:.0f} ms, " if t.get("ttft_ms") is not None else ""
    mode = u.get("mode")
    return (
        f"{u.get('completion_tokens', 0)} tokens in {seconds:.1f} s ({ttft}finish={final.get('finish_reason')}); "
        f"prompt {u.get('prompt_tokens', 0)} tokens: {u.get('cached_tokens', 0)} cached, "
        f"{u.get('recomputed_tokens', 0)} recomputed" + (f"; mode {mode}" if mode else "")
    )


def stream_completion(client: Any, req: GenerateRequest, out: TextIO) -> str:
    """Stream the completion's text to ``out`` (``client``: an ``httpx.Client`` at the server); the
    usage line. Raises ``ServerError`` for an error answer and httpx's errors for the transport."""
    t0 = time.perf_counter()
    final: dict[str, Any] | None = None
    with client.stream("POST", "/v1/generate", json=req.body(), headers={"Accept": "text/event-stream"}) as r:
        if r.status_code != 200:
            r.read()
            try:
                payload: Any = r.json()
            except ValueError:
                payload = r.text
            raise ServerError.of_payload(payload, r.status_code)
        for ev in sse_payloads(r.iter_lines()):
            if isinstance(ev, dict) and ev.get("error"):
                raise ServerError.of_payload(ev, r.status_code)
            if not isinstance(ev, dict):
                raise ServerError(f"the server sent a stream event that is not an object: {str(ev)[:200]}")
            if ev.get("text"):
                out.write(ev["text"])
                out.flush()
            if ev.get("finish_reason") is not None or ev.get("usage") is not None:
                final = ev
    out.write("\n")
    out.flush()
    if final is None:
        raise ServerError("the server's stream ended without its final event (finish_reason and usage)")
    return usage_line(final, time.perf_counter() - t0)


def raw_completion(engine: Any, req: GenerateRequest, seed: int, out: TextIO) -> str:
    """``--raw``: the prompt's own tokens (no template) completed by full recompute."""
    from hypic_agent.runtime.results import FinishEvent
    from hypic_agent.runtime.sampling import SamplingParams
    from hypic_agent.runtime.serving import Serving

    ids = tuple(engine.tokenizer.encode(req.prompt, add_special_tokens=True))

    class _Plan:
        segments: tuple = ()
        suffix_ids = ids
        bos_id = None

    params = SamplingParams(
        max_tokens=req.max_tokens, temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, seed=seed
    )
    t0 = time.perf_counter()
    serving = Serving.of(engine)
    try:
        for ev in serving.generate(_Plan(), params, mode="full_recompute"):
            if isinstance(ev, FinishEvent):
                out.write("\n")
                out.flush()
                return (
                    f"{ev.completion_tokens} tokens in {time.perf_counter() - t0:.1f} s (ttft {ev.ttft_ms:.0f} ms, "
                    f"finish={ev.finish_reason}); prompt {len(ids)} tokens, raw"
                )
            out.write(ev.text)
            out.flush()
    finally:
        serving.stop()  # the engine is the caller's
    return ""
