"""When to retry and how long to wait.

A request is retried (at most ``max_retries`` times, so ``max_retries + 1`` attempts) when no
response came back (connection error, timeout) or the status is 408, 409, 429 or 5xx. The
server may force the decision with ``x-should-retry: true|false``. The wait honors
``retry-after-ms`` / ``Retry-After`` (seconds or an HTTP date) when it is between 0 and 60 s,
else it is exponential backoff ``initial * 2**attempt`` capped at ``max_delay``, shortened by up
to ``jitter`` (a fraction) at random so that many clients do not retry in lockstep.
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass

import httpx

RETRY_STATUSES: frozenset[int] = frozenset({408, 409, 429})
MAX_RETRY_AFTER_S = 60.0


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff parameters. ``max_retries`` counts retries, not attempts."""

    max_retries: int = 2
    initial_delay: float = 0.5
    max_delay: float = 8.0
    jitter: float = 0.25

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")


def should_retry_status(response: httpx.Response) -> bool:
    """True for 408/409/429/5xx, unless the server says otherwise in ``x-should-retry``."""
    forced = response.headers.get("x-should-retry", "").strip().lower()
    if forced == "true":
        return True
    if forced == "false":
        return False
    return response.status_code in RETRY_STATUSES or response.status_code >= 500


def parse_retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds the server asked us to wait, or None if absent/unparseable."""
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            return float(ms) / 1000.0
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if parsed is None:
        return None
    return parsed.timestamp() - (time.time() if now is None else now)


def retry_delay(
    attempt: int,
    policy: RetryPolicy,
    headers: Mapping[str, str] | None = None,
    rng: random.Random | None = None,
) -> float:
    """Seconds to sleep before retry number ``attempt + 1`` (``attempt`` starts at 0)."""
    if headers is not None:
        after = parse_retry_after(headers)
        if after is not None and 0 <= after <= MAX_RETRY_AFTER_S:
            return after
    base = min(policy.initial_delay * (2.0**attempt), policy.max_delay)
    draw = (rng or random).random()
    return max(0.0, base * (1.0 - policy.jitter * draw))


# Indirections so tests can observe waits without sleeping (monkeypatch these two names).
def sleep(seconds: float) -> None:
    time.sleep(seconds)


async def async_sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)
