"""``Hypic``: the synchronous client.

```python
from hypic_client import Hypic, doc, system
client = Hypic("http://127.0.0.1:8000", api_key="sk-...")
resp = client.generate(segments=[system("Answer from the documents."), doc(text, title="Paris")],
                       query="What is the capital of France?", max_tokens=64)
resp.text, resp.usage.cached_tokens, resp.timings.ttft_ms
```
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, overload

import httpx

from . import _retry
from ._base import (
    DEFAULT_BASE_URL,
    DEFAULT_TIMEOUT,
    NOT_GIVEN,
    SSE,
    NotGiven,
    TimeoutLike,
    generate_body,
    make_options,
    parse_model,
)
from ._errors import APIConnectionError, APITimeoutError, make_status_error
from ._models import GenerateResponse, Health
from ._resources import Chat, Models, Segments
from ._segments import SegmentLike
from ._streaming import GenerateStream


class Hypic:
    """Client of a hypic-agent server.

    Args:
        base_url: server root, e.g. ``http://127.0.0.1:8000`` (a trailing ``/v1`` is ignored).
        api_key: sent as ``Authorization: Bearer <key>``; the server maps it to a tenant.
        timeout: seconds (or an ``httpx.Timeout``) per request; for streams, between events.
        max_retries: retries on connection errors, timeouts and 408/409/429/5xx (0 disables).
        transport: an httpx transport, e.g. ``httpx.MockTransport(handler)`` for tests.
        default_headers: extra headers on every request.
    """

    def __init__(
        self,
        base_url: str | httpx.URL | None = DEFAULT_BASE_URL,
        api_key: str | None = None,
        timeout: TimeoutLike = DEFAULT_TIMEOUT,
        max_retries: int = 2,
        transport: httpx.BaseTransport | None = None,
        *,
        default_headers: Mapping[str, str] | None = None,
    ) -> None:
        self._options = make_options(base_url, api_key, timeout, max_retries, default_headers)
        self._http = httpx.Client(
            base_url=self._options.base_url,
            timeout=timeout,
            transport=transport,
            headers=self._options.headers,
        )
        self.segments = Segments(self)
        self.chat = Chat(self)
        self.models = Models(self)

    @property
    def base_url(self) -> str:
        return self._options.base_url

    @property
    def max_retries(self) -> int:
        return self._options.retry.max_retries

    # --- transport with retries --------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        stream: bool = False,
        headers: Mapping[str, str] | None = None,
        timeout: TimeoutLike | NotGiven = NOT_GIVEN,
    ) -> httpx.Response:
        """Send one request with retries; return a 2xx response or raise a typed error.

        With ``stream=True`` the body of a 2xx response is left unread (the caller closes it).
        """
        extra: dict[str, Any] = {} if isinstance(timeout, NotGiven) else {"timeout": timeout}
        request = self._http.build_request(method, path, json=json, params=params, headers=headers, **extra)
        policy = self._options.retry
        attempt = 0
        while True:
            try:
                response = self._http.send(request, stream=stream)
            except httpx.TimeoutException as e:
                if attempt < policy.max_retries:
                    _retry.sleep(_retry.retry_delay(attempt, policy))
                    attempt += 1
                    continue
                raise APITimeoutError(request=request) from e
            except httpx.TransportError as e:
                if attempt < policy.max_retries:
                    _retry.sleep(_retry.retry_delay(attempt, policy))
                    attempt += 1
                    continue
                raise APIConnectionError(f"Connection error: {e!r}", request=request) from e
            if response.is_success:
                return response
            response.read()
            response.close()
            if attempt < policy.max_retries and _retry.should_retry_status(response):
                _retry.sleep(_retry.retry_delay(attempt, policy, response.headers))
                attempt += 1
                continue
            raise make_status_error(response)

    # --- endpoints ---------------------------------------------------------------------------

    @overload
    def generate(
        self,
        segments: SegmentLike | Sequence[SegmentLike] = ...,
        query: str | None = ...,
        *,
        stream: Literal[False] = ...,
        mode: str | None = ...,
        seam: float | str | None = ...,
        max_tokens: int | None = ...,
        temperature: float | None = ...,
        top_p: float | None = ...,
        top_k: int | None = ...,
        stop: str | Sequence[str] | None = ...,
        logprobs: bool | None = ...,
        extra_body: Mapping[str, Any] | None = ...,
        timeout: TimeoutLike | NotGiven = ...,
    ) -> GenerateResponse: ...

    @overload
    def generate(
        self,
        segments: SegmentLike | Sequence[SegmentLike] = ...,
        query: str | None = ...,
        *,
        stream: Literal[True],
        mode: str | None = ...,
        seam: float | str | None = ...,
        max_tokens: int | None = ...,
        temperature: float | None = ...,
        top_p: float | None = ...,
        top_k: int | None = ...,
        stop: str | Sequence[str] | None = ...,
        logprobs: bool | None = ...,
        extra_body: Mapping[str, Any] | None = ...,
        timeout: TimeoutLike | NotGiven = ...,
    ) -> GenerateStream: ...

    def generate(
        self,
        segments: SegmentLike | Sequence[SegmentLike] = (),
        query: str | None = None,
        *,
        stream: bool = False,
        mode: str | None = None,
        seam: float | str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        stop: str | Sequence[str] | None = None,
        logprobs: bool | None = None,
        extra_body: Mapping[str, Any] | None = None,
        timeout: TimeoutLike | NotGiven = NOT_GIVEN,
    ) -> GenerateResponse | GenerateStream:
        """``POST /v1/generate``: complete ``query`` after the (cached) ``segments``.

        ``mode`` picks the reuse method (``hypic`` default on the server; ``full_recompute``,
        ``prefix_cache``, ...), ``seam`` the recomputed window per segment (``"auto"``: chosen per
        segment under the server's budget). With ``stream=True`` returns a :class:`GenerateStream`
        of :class:`GenerateChunk` (the last carries usage).
        """
        body = generate_body(
            segments,
            query,
            stream=stream,
            mode=mode,
            seam=seam,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            stop=stop,
            logprobs=logprobs,
            extra_body=extra_body,
        )
        if stream:
            # NOTE: retries cover only the start of a stream (status/connect); a stream cut in the
            # middle raises, because replaying it would duplicate the text already delivered.
            response = self.request("POST", "/v1/generate", json=body, stream=True, headers=SSE, timeout=timeout)
            return GenerateStream(response)
        return parse_model(self.request("POST", "/v1/generate", json=body, timeout=timeout), GenerateResponse)

    def health(self) -> Health:
        """``GET /health``."""
        return parse_model(self.request("GET", "/health"), Health)

    # --- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Hypic:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Hypic(base_url={self.base_url!r}, max_retries={self.max_retries})"
