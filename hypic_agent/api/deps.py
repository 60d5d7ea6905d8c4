"""Route dependencies: the caller's tenant (auth + rate limits) and access to ``/metrics``."""

from __future__ import annotations

from fastapi import BackgroundTasks, Request

from hypic_agent.api.auth import DEFAULT_TENANT, FailedKeyLimiter, client_address, presented_key, same_secret
from hypic_agent.api.state import ServerState, get_state
from hypic_agent.errors import AuthError, RateLimitError


def _failures(request: Request) -> FailedKeyLimiter:
    return request.app.state.auth_failures


def _wrong_key(request: Request, st: ServerState, key: str, message: str) -> AuthError:
    """Count a wrong key; raise 429 once its prefix (or its address) sent too many, else return the 401."""
    failures, address = _failures(request), client_address(request)
    st.metrics.auth_failures.inc()
    failures.check(key, address)
    failures.record(key, address)
    return AuthError(message, param="authorization")


def authenticate(request: Request, st: ServerState) -> str:
    """The caller's tenant. A valid key always authenticates; a missing key is 401, a wrong one 401
    (429 once its address sent too many wrong keys with its prefix, or in all)."""
    if st.auth.open:
        return DEFAULT_TENANT
    key = presented_key(request)
    if not key:
        raise AuthError("missing API key; send 'Authorization: Bearer <key>'", param="authorization")
    name = st.auth.tenant_for(key)
    if name is not None:
        return name
    raise _wrong_key(request, st, key, "unknown API key; check the key you were given")


def tenant(request: Request, background: BackgroundTasks) -> str:
    """Authenticate, then count the request against the tenant's rate limit. Once the response
    is sent, the hits the request made are written to the registry (a kill after that loses none)."""
    st = get_state(request)
    name = authenticate(request, st)
    request.state.tenant = name
    try:
        st.limiter.check(name)
    except RateLimitError:
        st.metrics.count_rate_limited(name)
        raise
    background.add_task(st.store.flush)
    return name


def metrics_access(request: Request) -> None:
    """``/metrics``: the metrics token when one is set (401 without it); else open without API keys,
    and with them closed (401) unless ``Settings.metrics_open``. A tenant's key is not the token."""
    st = get_state(request)
    token = st.settings.metrics_token
    if token:
        got = presented_key(request)
        if got and same_secret(got, token):
            return
        message = "GET /metrics needs the metrics token: send 'Authorization: Bearer <HYPIC_METRICS_TOKEN>'"
        if got:
            raise _wrong_key(request, st, got, message)
        raise AuthError(message, param="authorization")
    if st.auth.open or st.settings.metrics_open:
        return
    raise AuthError(
        "GET /metrics is closed while API keys are on: set HYPIC_METRICS_TOKEN and send it as "
        "'Authorization: Bearer <token>', or set HYPIC_METRICS_OPEN=true to serve it without one",
        param="authorization",
    )
