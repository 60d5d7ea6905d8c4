"""Exception tree of the client.

```
HypicError
 +-- APIError                      (anything that came from talking to the server)
      +-- APIConnectionError       (no HTTP response: DNS, refused, reset)
      |    +-- APITimeoutError
      +-- APIResponseValidationError (2xx whose body is not what the contract says)
      +-- APIStreamError           (an error event inside an SSE stream)
      +-- APIStatusError           (a 4xx/5xx response; one subclass per status)
           +-- BadRequestError (400), AuthenticationError (401), PermissionDeniedError (403),
               NotFoundError (404), ConflictError (409), UnprocessableEntityError (422),
               RateLimitError (429), InternalServerError (>= 500)
```

Status errors carry what the server's envelope ``{"error": {"type", "message", "param"}}``
said: ``.status_code``, ``.error_type``, ``.message``, ``.param`` and the decoded ``.body``.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

__all__ = [
    "APIConnectionError",
    "APIError",
    "APIResponseValidationError",
    "APIStatusError",
    "APIStreamError",
    "APITimeoutError",
    "AuthenticationError",
    "BadRequestError",
    "ConflictError",
    "HypicError",
    "InternalServerError",
    "NotFoundError",
    "PermissionDeniedError",
    "RateLimitError",
    "UnprocessableEntityError",
]


class HypicError(Exception):
    """Base class of every exception this package raises."""


class APIError(HypicError):
    """An error while talking to the server. ``request`` is the httpx request, when there was one."""

    def __init__(
        self,
        message: str,
        *,
        request: httpx.Request | None = None,
        body: Any = None,
        error_type: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.request = request
        self.body = body
        self.error_type = error_type
        self.param = param


class APIConnectionError(APIError):
    """The server could not be reached or dropped the connection (retried before raising)."""

    def __init__(self, message: str = "Connection error.", *, request: httpx.Request | None = None) -> None:
        super().__init__(message, request=request)


class APITimeoutError(APIConnectionError):
    """The request timed out (retried before raising). Raise ``timeout=`` if generations are long."""

    def __init__(self, message: str = "Request timed out.", *, request: httpx.Request | None = None) -> None:
        super().__init__(message, request=request)


class APIResponseValidationError(APIError):
    """A successful response whose body does not parse as the expected type."""


class APIStreamError(APIError):
    """The server reported an error in the middle of an SSE stream."""


class APIStatusError(APIError):
    """A 4xx/5xx response. ``status_code``, ``error_type``, ``message``, ``param``, ``body``, ``response``."""

    status_code: int

    def __init__(
        self,
        message: str,
        *,
        response: httpx.Response,
        body: Any = None,
        error_type: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message, request=response.request, body=body, error_type=error_type, param=param)
        self.response = response
        self.status_code = response.status_code

    def __str__(self) -> str:
        kind = f" {self.error_type}" if self.error_type else ""
        where = f" (param: {self.param})" if self.param else ""
        return f"Error {self.status_code}{kind}: {self.message}{where}"


class BadRequestError(APIStatusError):
    """400: the request is malformed; ``message`` says what to fix, ``param`` which field."""


class AuthenticationError(APIStatusError):
    """401: missing or unknown API key; pass ``api_key=`` to the client."""


class PermissionDeniedError(APIStatusError):
    """403: the key is valid but may not do this."""


class NotFoundError(APIStatusError):
    """404: unknown segment id, model or route."""


class ConflictError(APIStatusError):
    """409: conflicting state (retried before raising)."""


class UnprocessableEntityError(APIStatusError):
    """422: the body failed validation; ``param`` names the field."""


class RateLimitError(APIStatusError):
    """429: too many requests for this tenant (retried, honoring Retry-After, before raising)."""


class InternalServerError(APIStatusError):
    """5xx: the server failed (retried before raising)."""


_BY_STATUS: dict[int, type[APIStatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    422: UnprocessableEntityError,
    429: RateLimitError,
}


def decode_body(response: httpx.Response) -> Any:
    """JSON body if it parses, else the text (``None`` when empty)."""
    text = response.text
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_error_payload(body: Any) -> tuple[str | None, str | None, str | None]:
    """(type, message, param) from the envelope, FastAPI's ``{"detail": ...}`` or plain text."""
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):
            param = err.get("param")
            return err.get("type"), _as_text(err.get("message")), None if param is None else str(param)
        if isinstance(err, str):
            return None, err, None
        detail = body.get("detail")
        if isinstance(detail, str):
            return None, detail, None
        if isinstance(detail, list) and detail and isinstance(detail[0], dict):
            first = detail[0]
            loc = [str(p) for p in first.get("loc", []) if p != "body"]
            return first.get("type"), _as_text(first.get("msg")), ".".join(loc) or None
        return None, _as_text(body.get("message")), None
    if isinstance(body, str) and body.strip():
        return None, body.strip()[:500], None
    return None, None, None


def _as_text(value: Any) -> str | None:
    return None if value is None else str(value)


def make_status_error(response: httpx.Response) -> APIStatusError:
    """Build the typed exception for a 4xx/5xx response whose body has been read."""
    body = decode_body(response)
    error_type, message, param = parse_error_payload(body)
    status = response.status_code
    cls = _BY_STATUS.get(status) or (InternalServerError if status >= 500 else APIStatusError)
    message = message or response.reason_phrase or f"HTTP {status}"
    return cls(message, response=response, body=body, error_type=error_type, param=param)
