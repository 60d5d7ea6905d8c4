"""API keys -> tenants, and per-tenant request rate limits.

Keys come from ``Settings.api_keys`` (``{"<key>": "<tenant>"}``), sent as
``Authorization: Bearer <key>`` or ``X-API-Key: <key>``. With no keys configured the server is
open and every request belongs to the single tenant ``default``. The tenant namespace is salted
into every segment key (``segments/keys.py``), so tenants never share, list or time each
other's entries.
"""

from __future__ import annotations

import hmac
import threading
import time
from collections import deque
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
        key = _presented_key(request)
        if not key:
            raise AuthError("missing API key; send 'Authorization: Bearer <key>'", param="authorization")
        for known, tenant in self._keys.items():  # constant-time compare against every key
            if hmac.compare_digest(known.encode(), key.encode()):
                return tenant
        raise AuthError("unknown API key; check the key you were given", param="authorization")


def _presented_key(request: Request) -> str | None:
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
