"""Route dependencies: the caller's tenant (auth + rate limit)."""

from __future__ import annotations

from fastapi import Request

from hypic_agent.api.state import get_state
from hypic_agent.errors import RateLimitError


def tenant(request: Request) -> str:
    """Authenticate, then count the request against the tenant's rate limit."""
    st = get_state(request)
    name = st.auth.tenant_of(request)
    request.state.tenant = name
    try:
        st.limiter.check(name)
    except RateLimitError:
        st.metrics.rate_limited.labels(name).inc()
        raise
    return name
