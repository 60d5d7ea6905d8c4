"""One error envelope for every failure: ``{"error": {"type", "message", "param"}}``.

Mapping onto HTTP:

| cause                                   | status | type                       |
|-----------------------------------------|--------|----------------------------|
| ``HypicError`` subclasses               | .status| .type (``errors.py``)      |
| body is not valid JSON                  | 400    | ``invalid_json``           |
| unknown segment ``kind``                | 422    | ``unknown_kind``           |
| a value out of range (``wire.py``)      | 400    | ``invalid_request``        |
| any other schema violation              | 422    | ``invalid_request``        |
| body over ``max_body_bytes``            | 413    | ``payload_too_large``      |
| body not in within ``body_timeout_s``   | 408    | ``request_timeout``        |
| bodies held over ``max_inflight_body_bytes`` | 503 | ``overloaded``          |
| the engine process died (``EngineDeadError``) | 503 | ``engine_dead``         |
| unknown route / method                  | 404/405| ``not_found`` / ``method_not_allowed`` |
| anything else (``ErrorGuardMiddleware``)| 500    | ``internal_error``         |
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from hypic_agent.errors import (  # noqa: F401 (re-exported for the routes)
    HypicError,
    InvalidRequestError,
    PayloadTooLargeError,
    ServiceUnavailableError,
    TooManySegmentsError,
)
from hypic_agent.wire import INVALID_VALUE

_HTTP_TYPES = {
    400: "invalid_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    413: "payload_too_large",
    415: "unsupported_media_type",
    429: "rate_limited",
    503: "overloaded",
}


def envelope(type_: str, message: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"type": type_, "message": message, "param": param}}


def error_response(status: int, type_: str, message: str, param: str | None = None, **headers: str) -> JSONResponse:
    return JSONResponse(envelope(type_, message, param), status_code=status, headers=headers or None)


def error_of(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """Status and envelope for an exception (used in SSE streams too)."""
    if isinstance(exc, HypicError):
        return exc.status, envelope(exc.type, exc.message, exc.param)
    return 500, envelope("internal_error", "internal server error; see the server log")


def _loc_param(loc: tuple[Any, ...]) -> str | None:
    if loc and loc[0] in ("body", "query", "path", "header"):
        loc = loc[1:]  # where it came from, not a field (a body field may be called "query")
    parts = [str(p) for p in loc]
    # drop discriminator tags pydantic inserts into the location ("segments.0.document.text")
    return ".".join(parts) or None


_VALUE_ERRORS = (INVALID_VALUE, "string_unicode")
"""Well-typed values out of range, or text that is not valid Unicode: 400, not 422."""

_JSON_TYPES = {str: "a string", bool: "a boolean", int: "an integer", float: "a number", dict: "an object"}
_TYPE_LABELS = {"float", "int", "bool", "str", "none", "dict", "list"}
"""The labels pydantic puts after a union field's name, one per member (``seam.float``)."""


def _got(error: Mapping[str, Any]) -> str:
    """``, got a string ("4")`` for a type error: what the client sent, briefly."""
    if not str(error.get("type", "")).endswith("_type") or "input" not in error:
        return ""
    value = error["input"]
    if value is None:
        return ", got null"
    what = next((name for t, name in _JSON_TYPES.items() if type(value) is t), None)
    if what is None:
        return ", got an array" if isinstance(value, list) else ""
    if isinstance(value, dict):
        return f", got {what}"
    shown = json.dumps(value, ensure_ascii=False)
    return f", got {what} ({shown if len(shown) <= 40 else shown[:37] + '...'})"


def validation_error(exc: RequestValidationError) -> tuple[int, dict[str, Any]]:
    errors = exc.errors()
    if not errors:
        return 422, envelope("invalid_request", "the request body is invalid")
    # a union field reports one error per member: the value error, if any, is the one to show
    first = next((e for e in errors if e.get("type") in _VALUE_ERRORS), errors[0])
    kind = first.get("type", "")
    loc = tuple(first.get("loc", ()))
    if kind == "json_invalid":
        ctx = first.get("ctx", {}) or {}
        detail = ctx.get("error", first.get("msg", ""))
        return 400, envelope("invalid_json", f"the body is not valid JSON ({detail}); send a JSON object", None)
    if loc == ("body",) and kind in ("model_attributes_type", "dict_type", "missing"):
        what = "needs a JSON body" if kind == "missing" else "body must be a JSON object"
        return 400, envelope("invalid_json", f"the request {what}; send it with Content-Type: application/json")
    if kind == "invalid_segment_kind":
        return 422, envelope("unknown_kind", str(first.get("msg")), f"{_loc_param(loc) or 'segments'}.kind")
    param = _loc_param(_strip_tags(loc))
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if kind.endswith("_type") or kind == "literal_error":  # a union's members: say every type it takes
        same = [e for e in errors if _loc_param(_strip_tags(tuple(e.get("loc", ())))) == param]
        options = dict.fromkeys(str(e.get("msg", "")).removeprefix("Input should be ") for e in same)
        if len(options) > 1:
            msg = "Input should be " + " or ".join(options)
        msg += _got(first)
    if kind == "string_unicode":
        msg = "is not valid Unicode text (a lone UTF-16 surrogate?)"
    if kind == "missing":
        msg = f"field {param!r} is required"
    elif param:
        msg = f"{param}: {msg}"
    more = len({_loc_param(_strip_tags(tuple(e.get("loc", ())))) for e in errors} - {param})
    if more:
        msg += f" (and {more} more problem{'s' if more > 1 else ''})"
    return (400 if kind in _VALUE_ERRORS else 422), envelope("invalid_request", msg, param)


def _strip_tags(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    tags = {"system", "document", "skill", "memory", "turn", "text", "ref", "str", "list[...]"}
    out: list[Any] = []
    for i, p in enumerate(loc):
        # a union/discriminator tag right after a segment's index ("segments", 0, "document", "text")
        if isinstance(p, str) and p in tags and i > 1 and isinstance(loc[i - 1], int) and loc[i - 2] == "segments":
            continue
        # a union member's label ("stop", "list[function-after[check_text(), str]]", 1; "seam", "float")
        if isinstance(p, str) and ("[" in p or (p in _TYPE_LABELS and i > 0 and isinstance(loc[i - 1], str))):
            continue
        out.append(p)
    return tuple(out)


_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def allowed_methods(request: Request) -> list[str]:
    """Every method some route of the app takes at this path (Starlette's 405 names only the first
    route that matched the path, e.g. ``GET`` for ``/v1/segments/{id}``, which also takes PATCH and
    DELETE): each method is matched against every route, as the router would."""
    routes = request.app.router.routes
    return [m for m in _METHODS if any(r.matches({**request.scope, "method": m})[0] == Match.FULL for r in routes)]


def install_error_handlers(app: FastAPI, on_error: Any = None) -> None:
    """Register handlers; ``on_error(type)`` is called for every error response (metrics)."""

    def _respond(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> JSONResponse:
        if on_error is not None:
            on_error(body["error"]["type"])
        return JSONResponse(body, status_code=status, headers=headers)

    @app.exception_handler(HypicError)
    async def _hypic(_: Request, exc: HypicError) -> JSONResponse:
        headers = None
        retry = getattr(exc, "retry_after", None)
        if retry is not None:
            headers = {"Retry-After": str(max(1, int(retry + 0.999)))}
        status, body = error_of(exc)
        return _respond(status, body, headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        status, body = validation_error(exc)
        return _respond(status, body)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        type_ = _HTTP_TYPES.get(exc.status_code, "invalid_request" if exc.status_code < 500 else "internal_error")
        msg = str(exc.detail)
        if exc.status_code == 404 and msg == "Not Found":
            msg = f"no route {request.method} {request.url.path}; see GET /docs for the routes"
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            allowed = allowed_methods(request)
            headers["Allow"] = ", ".join(allowed) or headers.get("Allow", "")
            msg = f"{request.method} is not allowed on {request.url.path}; it takes {', '.join(allowed)}"
        return _respond(exc.status_code, envelope(type_, msg), headers or None)

    # NOTE: any other exception is answered by ``middleware.ErrorGuardMiddleware`` (a handler for
    # ``Exception`` here would run in Starlette's outermost middleware, which re-raises it)
