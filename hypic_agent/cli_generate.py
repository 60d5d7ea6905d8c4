"""``hypic-agent generate``: one completion from the command line, with segments and a mode.

Every argument is checked before anything is loaded (``check_request``: mode, seam, sampling,
segment files and kinds, URL), so a bad one fails in well under a second. Then:

* ``--url URL``: the request goes to a running server through the SDK (``hypic_client``): no
  model load, and the server's segment cache serves repeated segments (``cached_tokens``);
* otherwise the model is loaded here (start-up progress on stderr) and the server's own app runs
  in-process behind the same SDK calls, with a throw-away segment store;
* ``--raw`` (local only, no segments): complete the prompt text as is, without the chat template.

The completion streams to stdout; usage and timings go to stderr (``usage_line``).
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
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
    sdk_kwargs: dict[str, Any] = field(default_factory=dict)

    def body(self) -> dict[str, Any]:
        """Keyword arguments of ``Hypic.generate``."""
        return dict(
            segments=list(self.segments), query=self.prompt, mode=self.mode, seam=self.seam,
            max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
        )  # fmt: skip


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


def require_sdk() -> None:
    try:
        import hypic_client  # noqa: F401
    except ImportError as e:
        raise BadArgument(
            "the Python SDK is not installed: pip install -e ./sdk/python (from the repository root)"
        ) from e


def check_model(settings: Settings) -> None:
    """An unknown model name or a missing path fails here, before the load (a catalog model that
    is not downloaded yet is fine: the load fetches it; tiny:<arch> is checked by the load)."""
    from hypic_agent.runtime.models.catalog import BUNDLED, CATALOG, resolve_model

    name = settings.model.strip()
    if name in CATALOG or name in BUNDLED or name == "tiny" or name.startswith("tiny:"):
        return
    resolve_model(name, settings, fetch=False)


def client_errors() -> tuple[type[Exception], ...]:
    """The SDK's error classes (connection, status, stream), or none without the SDK."""
    try:
        from hypic_client import HypicError as ClientError
    except ImportError:
        return ()
    return (ClientError,)


def client_error_message(e: Exception, url: str | None) -> str:
    """What went wrong talking to the server, in words (an unreachable ``--url`` says so)."""
    from hypic_client import APIConnectionError, APITimeoutError

    if isinstance(e, APITimeoutError):
        return f"the server at {url or 'in-process'} did not answer in time ({e})"
    if isinstance(e, APIConnectionError) and url is not None:
        return f"cannot reach a server at {url} ({e.__cause__ or e}); is `hypic-agent serve` running there?"
    return str(e)


# ---------------------------------------------------------------------------- clients
_RECOMPUTED = ("content-length", "content-encoding", "transfer-encoding")


def _in_process(test_client: Any) -> Any:
    """An httpx transport that hands each request to an in-process ASGI test client."""
    import httpx

    class InProcess(httpx.BaseTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            # by method, URL and bytes: the test client may be built on another httpx
            r = test_client.request(request.method, str(request.url), headers=request.headers, content=request.read())
            headers = [(k, v) for k, v in r.headers.multi_items() if k.lower() not in _RECOMPUTED]
            return httpx.Response(r.status_code, headers=headers, content=r.content, request=request)

    return InProcess()


@contextmanager
def remote_client(url: str, api_key: str | None) -> Iterator[Any]:
    from hypic_client import Hypic

    with Hypic(url, api_key=api_key, timeout=600.0, max_retries=0) as client:
        yield client


@contextmanager
def local_client(settings: Settings, engine: Any) -> Iterator[Any]:
    """The server's app over this process's engine, with a segment store in a temporary folder."""
    from fastapi.testclient import TestClient
    from hypic_client import Hypic

    from hypic_agent.api.app import create_app

    with tempfile.TemporaryDirectory(prefix="hypic-generate-") as tmp:
        db = f"sqlite:///{Path(tmp) / 'registry.sqlite3'}"
        app = create_app(settings.model_copy(update={"store_dir": Path(tmp) / "store", "database_url": db}), engine)
        with (
            TestClient(app, raise_server_exceptions=False) as tc,
            Hypic("http://in-process", transport=_in_process(tc), timeout=600.0, max_retries=0) as client,
        ):
            yield client


# ---------------------------------------------------------------------------- output
def usage_line(resp: Any, seconds: float) -> str:
    u, t = resp.usage, resp.timings
    ttft = f"ttft {t.ttft_ms:.0f} ms, " if t is not None and t.ttft_ms is not None else ""
    mode = getattr(u, "mode", None)
    return (
        f"{u.completion_tokens} tokens in {seconds:.1f} s ({ttft}finish={resp.finish_reason}); prompt "
        f"{u.prompt_tokens} tokens: {u.cached_tokens} cached, {u.recomputed_tokens} recomputed"
        + (f"; mode {mode}" if mode else "")
    )


def stream_completion(client: Any, req: GenerateRequest, out: TextIO) -> str:
    """Stream the completion's text to ``out``; the usage line."""
    t0 = time.perf_counter()
    with client.generate(stream=True, **req.body()) as stream:
        for delta in stream.text_deltas():
            out.write(delta)
            out.flush()
        resp = stream.final_response()
    out.write("\n")
    out.flush()
    return usage_line(resp, time.perf_counter() - t0)


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
