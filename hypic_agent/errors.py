"""Exception tree. Every error a user can cause says what to fix.

The API layer maps these onto HTTP statuses and the ``{"error": {type, message, param}}`` envelope.
"""

from __future__ import annotations


class HypicError(Exception):
    """Base class. ``type`` is the wire error type, ``param`` the offending field if any."""

    type: str = "internal_error"
    status: int = 500

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidRequestError(HypicError, ValueError):
    type = "invalid_request"
    status = 400


class ModelConfigError(InvalidRequestError):
    """A config.json we cannot run (unknown model_type, missing field)."""

    type = "model_config_error"


class WeightsError(InvalidRequestError):
    """Missing, mismatched or corrupt weight files."""

    type = "weights_error"


class ModelNotAvailableError(HypicError):
    """A catalog/hub model that cannot be fetched here (offline, unknown id)."""

    type = "model_not_available"
    status = 404


class ModelNotFoundError(HypicError):
    """A request names a model this server does not serve."""

    type = "model_not_found"
    status = 404


class ContextLengthError(InvalidRequestError):
    type = "context_length_exceeded"


class UnknownModeError(InvalidRequestError):
    type = "unknown_mode"


class SegmentNotFoundError(HypicError):
    type = "segment_not_found"
    status = 404


class ConflictError(HypicError):
    type = "conflict"
    status = 409


class ForbiddenError(HypicError):
    type = "forbidden"
    status = 403


class RateLimitError(HypicError):
    type = "rate_limited"
    status = 429


class AuthError(HypicError):
    type = "unauthorized"
    status = 401


class TooManySegmentsError(InvalidRequestError):
    type = "too_many_segments"


class PayloadTooLargeError(HypicError):
    type = "payload_too_large"
    status = 413


class StoreLimitError(PayloadTooLargeError):
    """A request would add more entry bytes to the segment store than one request may."""

    type = "store_limit_exceeded"


class StoreRateError(RateLimitError):
    """A tenant's requests added their entry bytes a minute; retry after ``retry_after`` seconds."""

    type = "store_rate_limited"

    def __init__(self, message: str, *, param: str | None = None, retry_after: float = 1.0) -> None:
        super().__init__(message, param=param)
        self.retry_after = retry_after


class ServiceUnavailableError(HypicError):
    type = "unavailable"
    status = 503


class OverloadedError(ServiceUnavailableError):
    """The server holds as many request bodies as it may; retry after ``retry_after`` seconds."""

    type = "overloaded"

    def __init__(self, message: str, *, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class EngineDeadError(ServiceUnavailableError):
    """The engine process (``runtime.core_process``) is gone: requests in flight when it died and every
    request after it fail with this (503) until the server is restarted; ``/health`` says so too."""

    type = "engine_dead"


class RequestTimeoutError(HypicError):
    """The client did not send its request (body) in time; the connection is closed."""

    type = "request_timeout"
    status = 408


class QueueFullError(RateLimitError):
    """The scheduler's waiting queue is full; retry after ``retry_after`` seconds."""

    type = "queue_full"

    def __init__(self, message: str, *, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ClientClosedError(HypicError):
    """The client went away before the answer was complete; its request was cancelled."""

    type = "client_closed_request"
    status = 499
