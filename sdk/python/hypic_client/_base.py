"""What the sync and async clients share: options, headers, request bodies, response parsing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from ._errors import APIResponseValidationError
from ._retry import RetryPolicy
from ._segments import SegmentLike, segments_to_wire
from ._version import __version__

M = TypeVar("M", bound=BaseModel)

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
DEFAULT_TIMEOUT = 60.0

TimeoutLike = float | httpx.Timeout | None
SSE = {"Accept": "text/event-stream"}


class NotGiven:
    """Sentinel for "use the client's default" where ``None`` means "no timeout"."""

    def __repr__(self) -> str:
        return "NOT_GIVEN"


NOT_GIVEN = NotGiven()


@dataclass(frozen=True)
class ClientOptions:
    base_url: str
    api_key: str | None
    timeout: TimeoutLike
    retry: RetryPolicy
    headers: dict[str, str]


def make_options(
    base_url: str | httpx.URL | None,
    api_key: str | None,
    timeout: TimeoutLike,
    max_retries: int,
    default_headers: Mapping[str, str] | None,
) -> ClientOptions:
    """Normalize constructor arguments. A trailing ``/v1`` on ``base_url`` is dropped (paths carry it)."""
    url = str(base_url or DEFAULT_BASE_URL).rstrip("/")
    url = url.removesuffix("/v1")
    headers = {"Accept": "application/json", "User-Agent": f"hypic-client/{__version__}"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    headers.update(default_headers or {})
    return ClientOptions(url, api_key, timeout, RetryPolicy(max_retries=max_retries), headers)


def segment_path(segment_id: str) -> str:
    if not segment_id:
        raise ValueError("segment id must be a non-empty string (the id returned by segments.put())")
    return f"/v1/segments/{quote(segment_id, safe='')}"


def drop_none(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def generate_body(
    segments: SegmentLike | Sequence[SegmentLike],
    query: str | None,
    *,
    stream: bool,
    mode: str | None,
    seam: float | str | None,
    max_tokens: int | None,
    temperature: float | None,
    top_p: float | None,
    top_k: int | None,
    stop: str | Sequence[str] | None,
    logprobs: bool | None,
    extra_body: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """JSON body of ``POST /v1/generate``; unset sampling fields are left to the server's defaults."""
    wire = segments_to_wire(segments)
    if not wire and not query:
        raise ValueError("generate() needs at least one segment or a query")
    body = drop_none(
        {
            "segments": wire,
            "query": query,
            "mode": mode,
            "seam": seam,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_p": top_p,
            "top_k": top_k,
            "stop": [stop] if isinstance(stop, str) else (list(stop) if stop is not None else None),
            "logprobs": logprobs,
        }
    )
    body["stream"] = stream
    body.update(extra_body or {})
    return body


def update_body(pin: bool | None, ttl: float | None) -> dict[str, Any]:
    if pin is None and ttl is None:
        raise ValueError("segments.update() needs pin= and/or ttl=")
    return {"cache": drop_none({"pin": pin, "ttl": ttl})}


def parse_json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError as e:
        raise APIResponseValidationError(
            f"expected JSON from {response.request.method} {response.request.url.path}, got {response.text[:200]!r}",
            request=response.request,
            body=response.text,
        ) from e


def parse_model(response: httpx.Response, cls: type[M]) -> M:
    data = parse_json(response)
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise APIResponseValidationError(
            f"response of {response.request.url.path} does not match {cls.__name__}: {e}",
            request=response.request,
            body=data,
        ) from e


def parse_model_list(response: httpx.Response, cls: type[M]) -> list[M]:
    """``{"data": [...]}`` (or a bare list) -> list of models."""
    data = parse_json(response)
    items = data.get("data") if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise APIResponseValidationError(
            f"expected {{'data': [...]}} from {response.request.url.path}", request=response.request, body=data
        )
    try:
        return [cls.model_validate(x) for x in items]
    except ValidationError as e:
        raise APIResponseValidationError(str(e), request=response.request, body=data) from e
