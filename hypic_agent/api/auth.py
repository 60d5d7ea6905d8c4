"""API keys -> tenants, per-tenant request rate limits, and failed keys per client address.

Keys come from ``Settings.api_keys`` (``{"<key>": "<tenant>"}``), sent as
``Authorization: Bearer <key>`` or ``X-API-Key: <key>``. With no keys configured the server is
open and every request belongs to the single tenant ``default``. The tenant namespace is salted
into every segment key (``segments/keys.py``), so tenants never share, list or time each
other's entries. A client address that sends more than ``Settings.auth_failures_per_minute``
wrong keys gets 429 for every keyed request, right keys too, until its minute has passed
(``FailedKeyLimiter``); the address is the TCP peer (a proxy in front is one address).
"""

from __future__ import annotations

import hmac
import ipaddress
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping

from fastapi import Request

from hypic_agent.errors import AuthError, RateLimitError

DEFAULT_TENANT = "default"


class KeyAuth:
    def __init__(self, api_keys: Mapping[str, str]) -> None:
        self._keys = dict(api_keys)

    @property
    def open(self) -> bool:
        return not self._keys

    def tenant_of(self, request: Request) -> str:
        if self.open:
            return DEFAULT_TENANT
        key = presented_key(request)
        if not key:
            raise AuthError("missing API key; send 'Authorization: Bearer <key>'", param="authorization")
        for known, tenant in self._keys.items():  # constant-time compare against every key
            if hmac.compare_digest(known.encode(), key.encode()):
                return tenant
        raise AuthError("unknown API key; check the key you were given", param="authorization")


def client_address(request: Request) -> str:
    return request.client.host if request.client is not None else "unknown"


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def same_secret(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


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
    """Wrong keys per client address in a sliding window (``per_minute == 0`` disables it).

    ``check`` raises 429 while an address has ``per_minute`` failures in the window; ``record``
    counts one. At most ``max_addresses`` addresses are tracked (the least recent go first)."""

    def __init__(
        self,
        per_minute: int,
        clock: Callable[[], float] = time.monotonic,
        window_s: float = 60.0,
        max_addresses: int = 10_000,
    ) -> None:
        self.per_minute = per_minute
        self.window_s = window_s
        self.clock = clock
        self.max_addresses = max_addresses
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def _recent(self, address: str, now: float) -> deque[float] | None:
        q = self._failures.get(address)
        while q and q[0] <= now - self.window_s:
            q.popleft()
        if q is not None and not q:
            del self._failures[address]
            return None
        return q

    def check(self, address: str) -> None:
        if self.per_minute <= 0:
            return
        now = self.clock()
        with self._lock:
            q = self._recent(address, now)
            if q is not None and len(q) >= self.per_minute:
                err = RateLimitError(
                    f"{len(q)} wrong API keys from this address within {self.window_s:.0f} s (the limit is "
                    f"{self.per_minute}); requests that need a key are refused until then",
                    param="authorization",
                )
                err.retry_after = q[0] + self.window_s - now  # type: ignore[attr-defined]
                raise err

    def record(self, address: str) -> None:
        if self.per_minute <= 0:
            return
        now = self.clock()
        with self._lock:
            q = self._recent(address, now) or deque()
            q.append(now)
            self._failures[address] = q
            self._failures.move_to_end(address)
            while len(self._failures) > self.max_addresses:
                self._failures.popitem(last=False)
