"""Route dependencies: the caller's tenant (auth + rate limits) and access to ``/metrics``."""

from __future__ import annotations

from fastapi import BackgroundTasks, Request

from hypic_agent.api.auth import (
    DEFAULT_TENANT,
    FailedKeyLimiter,
    client_address,
    is_loopback,
    presented_key,
    same_secret,
)
from hypic_agent.api.state import ServerState, get_state
from hypic_agent.errors import AuthError, ForbiddenError, RateLimitError


def _failures(request: Request) -> FailedKeyLimiter:
    return request.app.state.auth_failures


def authenticate(request: Request, st: ServerState) -> str:
    """The caller's tenant; 401 for a missing or wrong key, 429 once its address sent too many wrong ones."""
    if st.auth.open:
        return DEFAULT_TENANT
    failures, address = _failures(request), client_address(request)
    failures.check(address)
    try:
        return st.auth.tenant_of(request)
    except AuthError:
        if presented_key(request):
            failures.record(address)
            st.metrics.auth_failures.inc()
        raise


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
    """``/metrics``: the metrics token when one is set; else, with API keys on, loopback clients only."""
    st = get_state(request)
    token = st.settings.metrics_token
    address = client_address(request)
    if token:
        failures = _failures(request)
        failures.check(address)
        got = presented_key(request)
        if got is None or not same_secret(got, token):
            if got:
                failures.record(address)
                st.metrics.auth_failures.inc()
            raise AuthError(
                "GET /metrics needs the metrics token: send 'Authorization: Bearer <HYPIC_METRICS_TOKEN>'",
                param="authorization",
            )
    elif not st.auth.open and not is_loopback(address):
        raise ForbiddenError(
            "with API keys on, GET /metrics answers loopback clients only; set HYPIC_METRICS_TOKEN to scrape it "
            "from elsewhere",
            param=None,
        )
