"""Warm the API process's request path before ``serve`` listens.

The engine's warm start (``runtime.warm_start``) compiles and captures the model's work; the API
process has first-use costs of its own that the first user request would pay: FastAPI builds a
route's dependant and validators on its first request, pydantic its type adapters, anyio imports its
asyncio backend on first use, and the SSE, tokenizer and engine-pipe paths run for the first time.
Measured on this project's CPU box (tiny model, in-process ASGI): the first ``POST /v1/generate``
spent ~46 ms more outside the engine than the ones after it; on the H100 box the first request after
``"listening"`` took 206 ms against ~100 ms steady (``benchmarks/serving.py``).

``warm_routes`` sends what clients send first through the app itself (``httpx.ASGITransport``, no
socket), before ``"listening"``: ``/v1/generate`` with and without streaming and a streamed
``/v1/chat/completions``, each a one-token ``full_recompute`` answer to a few words (nothing is
stored). They are served as any request is (with the first API key's tenant when keys are set), so
they appear in the access log and the request metrics; a failure is logged, never fatal.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import httpx

from hypic_agent.api.logs import log_event
from hypic_agent.config import Settings

log = logging.getLogger("hypic.startup")

WARM_TEXT = "warm start"
WARM_TIMEOUT_S = 120.0  # the engine is warm already: a request this slow is a hang, not work


def warm_requests() -> list[tuple[str, dict[str, Any]]]:
    """(path, body) of each warm-up request, in the order sent."""
    generate = {
        "segments": [{"kind": "document", "text": WARM_TEXT}],
        "query": WARM_TEXT,
        "mode": "full_recompute",
        "max_tokens": 1,
    }
    chat = {"messages": [{"role": "user", "content": WARM_TEXT}], "max_tokens": 1, "stream": True}
    return [
        ("/v1/generate", {**generate, "stream": False}),
        ("/v1/generate", {**generate, "stream": True}),
        ("/v1/chat/completions", chat),
    ]


async def warm_routes(app: Any, settings: Settings) -> list[tuple[str, int]]:
    """Send ``warm_requests`` through ``app`` (its lifespan has started); returns (path, status) per
    request. Streams are read to their end."""
    headers = {"authorization": f"Bearer {next(iter(settings.api_keys))}"} if settings.api_keys else {}
    done: list[tuple[str, int]] = []
    t0 = time.perf_counter()
    transport = httpx.ASGITransport(app=app)
    client_log = logging.getLogger("httpx")  # its INFO line per request would read like a client's in the log
    level = client_log.level
    client_log.setLevel(logging.WARNING)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://warm-start", timeout=WARM_TIMEOUT_S) as c:
            for path, body in warm_requests():
                try:
                    async with c.stream("POST", path, json=body, headers=headers) as r:
                        async for _ in r.aiter_bytes():
                            pass
                        done.append((path, r.status_code))
                except Exception as exc:  # the server still starts: these paths then warm on first use
                    log_event(log, "API warm-up request failed", logging.WARNING, path=path, error=repr(exc))
                    done.append((path, 0))
    finally:
        client_log.setLevel(level)
    ok = sum(1 for _, s in done if s == 200)
    log_event(
        log,
        f"warmed the API routes: {ok} of {len(done)} requests in {time.perf_counter() - t0:.2f} s",
        logging.INFO if ok == len(done) else logging.WARNING,
        statuses=[s for _, s in done],
    )
    return done
