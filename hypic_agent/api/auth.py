"""API keys -> tenants, per-tenant request rate limits, and failed keys per client address.

Keys come from ``Settings.api_keys`` (``{"<key>": "<tenant>"}``), sent as
``Authorization: Bearer <key>`` or ``X-API-Key: <key>``. With no keys configured the server is
open and every request belongs to the single tenant ``default``. The tenant namespace is salted
into every segment key (``segments/prompt/keys.py``), so tenants never share, list or time each
other's entries. Wrong keys are limited per key prefix and client address
(``Settings.auth_failures_per_minute``) and per address (``auth_address_failures_per_minute``):
past either, that address's wrong keys get 429 until the window has passed; a valid key always
authenticates (``FailedKeyLimiter``). The address is the TCP peer (a proxy in front is one address).
"""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping

from fastapi import Request

from hypic_agent.config import Settings
from hypic_agent.errors import RateLimitError

DEFAULT_TENANT = "default"


class KeyAuth:
    def __init__(self, api_keys: Mapping[str, str]) -> None:
        self._keys = dict(api_keys)

    @property
    def open(self) -> bool:
        return not self._keys

    def tenant_for(self, key: str) -> str | None:
        """The tenant of ``key``, or None; compared in constant time against every known key."""
        found = None
        for known, tenant in self._keys.items():
            if hmac.compare_digest(known.encode(), key.encode("utf-8", "surrogatepass")):
                found = found or tenant
        return found


def client_address(request: Request) -> str:
    return request.client.host if request.client is not None else "unknown"


def same_secret(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode("utf-8", "surrogatepass"), b.encode("utf-8", "surrogatepass"))


def presented_key(request: Request) -> str | None:
    auth = request.headers.get("authorization")
    if auth:
        scheme, _, value = auth.partition(" ")
        return value.strip() if scheme.lower() == "bearer" else auth.strip()
    return request.headers.get("x-api-key")


class RateLimiter:
    """Sliding 60 s window of request times per tenant; ``per_minute == 0`` disables it."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic, window_s: float = 60.0) -> None:
        self.per_minute = per_minute
        self.window_s = window_s
        self.clock = clock
        self._seen: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def check(self, tenant: str) -> None:
        if self.per_minute <= 0:
            return
        now = self.clock()
        with self._lock:
            q = self._seen.setdefault(tenant, deque())
            while q and q[0] <= now - self.window_s:
                q.popleft()
            if len(q) >= self.per_minute:
                err = RateLimitError(
                    f"tenant {tenant!r} is over its limit of {self.per_minute} requests per minute; retry later",
                    param=None,
                )
                err.retry_after = q[0] + self.window_s - now  # type: ignore[attr-defined]
                raise err
            q.append(now)


class FailedKeyLimiter:
    """Wrong keys per (key prefix, client address) and per address, in a sliding window.

    ``check`` raises 429 while the pair has ``per_minute`` failures in the window, or the address
    ``per_address_minute`` failures with any prefix (``0`` disables either); ``record`` counts one.
    Only wrong keys are checked: a valid key is never refused here, so one tenant's (or an
    attacker's) wrong keys cannot lock another tenant out of a shared address. The prefix is the
    key's first ``prefix_chars`` characters, held as a hash. At most ``max_tracked`` pairs and
    addresses are tracked (the least recent go first)."""

    def __init__(
        self,
        per_minute: int,
        per_address_minute: int = 0,
        *,
        prefix_chars: int = 8,
        clock: Callable[[], float] = time.monotonic,
        window_s: float = 60.0,
        max_tracked: int = 10_000,
    ) -> None:
        self.per_minute = per_minute
        self.per_address_minute = per_address_minute
        self.prefix_chars = prefix_chars
        self.window_s = window_s
        self.clock = clock
        self.max_tracked = max_tracked
        self._failures: OrderedDict[tuple[str, str], deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings) -> FailedKeyLimiter:
        return cls(
            settings.auth_failures_per_minute,
            settings.auth_address_failures_per_minute,
            prefix_chars=settings.auth_key_prefix_chars,
        )

    def _prefix(self, key: str) -> str:
        return hashlib.sha256(key[: self.prefix_chars].encode("utf-8", "surrogatepass")).hexdigest()[:16]

    def _buckets(self, key: str, address: str) -> list[tuple[tuple[str, str], int, str]]:
        """(bucket, limit, what) of the limits that are on."""
        out = []
        if self.per_minute > 0:
            out.append(((self._prefix(key), address), self.per_minute, "with this key prefix from this address"))
        if self.per_address_minute > 0:
            out.append((("*", address), self.per_address_minute, "from this address"))
        return out

    def _recent(self, bucket: tuple[str, str], now: float) -> deque[float] | None:
        q = self._failures.get(bucket)
        while q and q[0] <= now - self.window_s:
            q.popleft()
        if q is not None and not q:
            del self._failures[bucket]
            return None
        return q

    def check(self, key: str, address: str) -> None:
        """Raise ``RateLimitError`` (with ``retry_after``) when ``key`` is one wrong key too many."""
        now = self.clock()
        with self._lock:
            for bucket, limit, what in self._buckets(key, address):
                q = self._recent(bucket, now)
                if q is not None and len(q) >= limit:
                    err = RateLimitError(
                        f"{len(q)} wrong API keys {what} within {self.window_s:.0f} s (the limit is {limit}); "
                        "wrong keys are refused until then: check the key you were given",
                        param="authorization",
                    )
                    err.retry_after = q[0] + self.window_s - now  # type: ignore[attr-defined]
                    raise err

    def record(self, key: str, address: str) -> None:
        now = self.clock()
        with self._lock:
            for bucket, limit, _ in self._buckets(key, address):
                q = self._recent(bucket, now) or deque(maxlen=limit)
                q.append(now)
                self._failures[bucket] = q
                self._failures.move_to_end(bucket)
            while len(self._failures) > self.max_tracked:
                self._failures.popitem(last=False)
