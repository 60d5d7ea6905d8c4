"""Route dependencies: the caller's tenant (auth + rate limit)."""

from __future__ import annotations

from fastapi import BackgroundTasks, Request

from hypic_agent.api.state import get_state
from hypic_agent.errors import RateLimitError


def tenant(request: Request, background: BackgroundTasks) -> str:
    """Authenticate, then count the request against the tenant's rate limit. Once the response
    is sent, the hits the request made are written to the registry (a kill after that loses none)."""
    st = get_state(request)
    name = st.auth.tenant_of(request)
    request.state.tenant = name
    try:
        st.limiter.check(name)
    except RateLimitError:
        st.metrics.rate_limited.labels(name).inc()
        raise
    background.add_task(st.store.flush)
    return name
