"""What each route declares it can answer besides 200, for the OpenAPI spec: the error envelope.

Every error of the API is ``{"error": {"type", "message", "param"}}`` (``errors.py``); routes
list their statuses with ``responses=error_responses(...)`` so clients (and the fuzz test,
``tests/api/test_fuzz.py``) know every status a route can return.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class ErrorOut(BaseModel):
    type: str = Field(description="machine-readable error type, e.g. invalid_request, segment_not_found")
    message: str = Field(description="what went wrong and what to do about it")
    param: str | None = Field(description="the request field at fault, if any")


class ErrorEnvelope(BaseModel):
    error: ErrorOut


_WHY = {
    400: "bad value: out of range, invalid JSON, unknown mode, over the context window, ...",
    401: "missing or unknown API key (or metrics token)",
    403: "not allowed",
    404: "no such segment for this API key",
    408: "the request body did not arrive in time (HYPIC_BODY_TIMEOUT_S); the connection is closed",
    409: "the tenant's pin quota is used up",
    413: "request body over the limit, new cache entries over the per-request store cap, or one entry larger "
    "than the tenant's pin quota",
    422: "the body or a parameter does not match the schema",
    429: "rate limited (requests or stored bytes per tenant, wrong API keys per client address, a full queue); "
    "see Retry-After",
    500: "internal error (logged with the request id)",
    503: "the server is starting, or holds as many request bodies as it may (see Retry-After)",
}

COMMON = (401, 429, 500, 503)
"""Every authenticated route can answer these."""
BODY = (400, 408, 413, 422)
"""Every route with a JSON body can answer these."""


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` of a route: each status with the envelope schema."""
    return {s: {"model": ErrorEnvelope, "description": _WHY[s]} for s in sorted(set(statuses))}
