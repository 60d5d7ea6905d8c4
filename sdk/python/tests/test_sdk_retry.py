"""Retries: statuses, Retry-After, max_retries, connection errors and timeouts (sync + async)."""

from __future__ import annotations

import asyncio
import email.utils
import http.server
import random
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
from hypic_client import (
    APIConnectionError,
    APITimeoutError,
    AsyncHypic,
    BadRequestError,
    ConflictError,
    Hypic,
    InternalServerError,
    RateLimitError,
)
from hypic_client._retry import RetryPolicy, parse_retry_after, retry_delay

OK = {"status": "ok"}


def scripted(*replies: httpx.Response | Exception) -> tuple[httpx.MockTransport, list[httpx.Request]]:
    """A transport answering the given replies in order (the last one repeats)."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        reply = replies[min(len(seen), len(replies)) - 1]
        if isinstance(reply, Exception):
            raise reply
        return reply

    return httpx.MockTransport(handler), seen


def make(transport: httpx.MockTransport, **kw) -> Hypic:
    return Hypic("http://hypic.test", transport=transport, **kw)


# --- delay computation ------------------------------------------------------------------------


def test_backoff_grows_exponentially_with_bounded_jitter():
    policy = RetryPolicy(initial_delay=0.5, max_delay=8.0, jitter=0.25)
    rng = random.Random(0)
    for attempt, base in enumerate([0.5, 1.0, 2.0, 4.0, 8.0, 8.0]):
        d = retry_delay(attempt, policy, rng=rng)
        assert base * 0.75 <= d <= base


def test_retry_after_forms():
    assert parse_retry_after({"retry-after": "3"}) == 3.0
    assert parse_retry_after({"retry-after-ms": "250"}) == 0.25
    date = email.utils.formatdate(time.time() + 10, usegmt=True)
    assert 8.0 <= parse_retry_after({"retry-after": date}) <= 10.5
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({}) is None


def test_retry_after_out_of_range_falls_back_to_backoff():
    policy = RetryPolicy(initial_delay=0.5, jitter=0.0)
    assert retry_delay(0, policy, {"retry-after": "2"}) == 2.0
    assert retry_delay(0, policy, {"retry-after": "3600"}) == 0.5
    assert retry_delay(1, policy, {"retry-after": "-1"}) == 1.0


def test_negative_max_retries_rejected():
    with pytest.raises(ValueError, match="max_retries"):
        Hypic(max_retries=-1)


# --- sync client ------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [408, 409, 429, 500, 502, 503, 504])
def test_retries_transient_statuses_then_succeeds(status: int, sleeps: list[float]):
    transport, seen = scripted(httpx.Response(status), httpx.Response(status), httpx.Response(200, json=OK))
    assert make(transport, max_retries=2).health().status == "ok"
    assert len(seen) == 3
    assert len(sleeps) == 2 and sleeps[0] <= sleeps[1] * 2


def test_retry_after_is_honored(sleeps: list[float]):
    transport, seen = scripted(
        httpx.Response(429, headers={"Retry-After": "2"}, json={"error": {"type": "rate_limited", "message": "slow"}}),
        httpx.Response(200, json=OK),
    )
    make(transport).health()
    assert sleeps == [2.0] and len(seen) == 2


def test_gives_up_after_max_retries(sleeps: list[float]):
    transport, seen = scripted(httpx.Response(503, json={"error": {"type": "overloaded", "message": "busy"}}))
    with pytest.raises(InternalServerError) as ei:
        make(transport, max_retries=3).health()
    assert len(seen) == 4 and len(sleeps) == 3
    assert ei.value.status_code == 503 and ei.value.error_type == "overloaded"


def test_max_retries_zero_means_one_attempt(sleeps: list[float]):
    transport, seen = scripted(httpx.Response(429), httpx.Response(200, json=OK))
    with pytest.raises(RateLimitError):
        make(transport, max_retries=0).health()
    assert len(seen) == 1 and sleeps == []


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_no_retry_on_client_errors(status: int, sleeps: list[float]):
    transport, seen = scripted(httpx.Response(status, json={"error": {"type": "x", "message": "fix it"}}))
    with pytest.raises(Exception) as ei:
        make(transport, max_retries=5).health()
    assert len(seen) == 1 and sleeps == []
    assert ei.value.status_code == status


def test_no_retry_on_400_generate(sleeps: list[float]):
    env = {"error": {"type": "invalid_request", "message": "segments must not be empty", "param": "segments"}}
    transport, seen = scripted(httpx.Response(400, json=env))
    with pytest.raises(BadRequestError) as ei:
        make(transport).generate(["x"], "q")
    assert len(seen) == 1 and ei.value.param == "segments"


def test_server_can_veto_or_force_retry(sleeps: list[float]):
    transport, seen = scripted(httpx.Response(503, headers={"x-should-retry": "false"}))
    with pytest.raises(InternalServerError):
        make(transport).health()
    assert len(seen) == 1
    transport, seen = scripted(httpx.Response(400, headers={"x-should-retry": "true"}), httpx.Response(200, json=OK))
    make(transport).health()
    assert len(seen) == 2


def test_409_is_retried_then_raised_as_conflict(sleeps: list[float]):
    transport, seen = scripted(httpx.Response(409, json={"error": {"type": "conflict", "message": "busy entry"}}))
    with pytest.raises(ConflictError):
        make(transport, max_retries=1).health()
    assert len(seen) == 2


def test_connection_errors_are_retried_then_raised(sleeps: list[float]):
    transport, seen = scripted(httpx.ConnectError("refused"), httpx.Response(200, json=OK))
    assert make(transport).health().status == "ok"
    transport, seen = scripted(httpx.ConnectError("refused"))
    with pytest.raises(APIConnectionError) as ei:
        make(transport, max_retries=2).health()
    assert len(seen) == 3 and not isinstance(ei.value, APITimeoutError)


def test_timeout_becomes_api_timeout_error(sleeps: list[float]):
    transport, seen = scripted(httpx.ReadTimeout("slow"))
    with pytest.raises(APITimeoutError):
        make(transport, max_retries=1).generate(["x"], "q")
    assert len(seen) == 2


@pytest.fixture
def slow_server() -> Iterator[str]:
    """A real HTTP server on localhost that answers after 2 s."""

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            time.sleep(2.0)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_real_socket_timeout(slow_server: str):
    t0 = time.perf_counter()
    with pytest.raises(APITimeoutError), Hypic(slow_server, timeout=0.2, max_retries=0) as c:
        c.health()
    assert time.perf_counter() - t0 < 1.5


# --- async client -----------------------------------------------------------------------------


def arun(fn: Callable[[], object]) -> object:
    return asyncio.run(fn())


def test_async_retries_and_retry_after(sleeps: list[float]):
    transport, seen = scripted(
        httpx.Response(503), httpx.Response(429, headers={"retry-after-ms": "100"}), httpx.Response(200, json=OK)
    )

    async def go():
        async with AsyncHypic("http://hypic.test", transport=transport) as c:
            return await c.health()

    assert arun(go).status == "ok"
    assert len(seen) == 3 and sleeps[1] == 0.1


def test_async_no_retry_on_400_and_timeout(sleeps: list[float]):
    transport, seen = scripted(httpx.Response(400, json={"error": {"type": "invalid_request", "message": "m"}}))

    async def bad():
        async with AsyncHypic("http://hypic.test", transport=transport) as c:
            await c.generate(["x"], "q")

    with pytest.raises(BadRequestError):
        arun(bad)
    assert len(seen) == 1

    transport2, seen2 = scripted(httpx.ReadTimeout("slow"))

    async def slow():
        async with AsyncHypic("http://hypic.test", transport=transport2, max_retries=2) as c:
            await c.health()

    with pytest.raises(APITimeoutError):
        arun(slow)
    assert len(seen2) == 3
