"""``AsyncHypic``: the asyncio twin of :class:`hypic_client.Hypic` (same methods, awaitable)."""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Mapping, Sequence
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
    drop_none,
    generate_body,
    make_options,
    parse_model,
    parse_model_list,
    segment_path,
    update_body,
)
from ._chat_stream import AsyncChatCompletionStream
from ._errors import APIConnectionError, APITimeoutError, make_status_error
from ._models import (
    ChatCompletion,
    GenerateResponse,
    Health,
    Model,
    ModelList,
    SegmentDeleted,
    SegmentInfo,
    SegmentPage,
)
from ._resources import chat_body, deleted_from
from ._segments import SegmentLike, segments_to_wire
from ._streaming import AsyncGenerateStream


class AsyncHypic:
    """Async client; arguments as :class:`hypic_client.Hypic` (``transport`` is an async transport,
    e.g. ``httpx.ASGITransport(app)`` or ``httpx.MockTransport``)."""

    def __init__(
        self,
        base_url: str | httpx.URL | None = DEFAULT_BASE_URL,
        api_key: str | None = None,
        timeout: TimeoutLike = DEFAULT_TIMEOUT,
        max_retries: int = 2,
        transport: httpx.AsyncBaseTransport | None = None,
        *,
        default_headers: Mapping[str, str] | None = None,
    ) -> None:
        self._options = make_options(base_url, api_key, timeout, max_retries, default_headers)
        self._http = httpx.AsyncClient(
            base_url=self._options.base_url, timeout=timeout, transport=transport, headers=self._options.headers
        )
        self.segments = AsyncSegments(self)
        self.chat = AsyncChat(self)
        self.models = AsyncModels(self)

    @property
    def base_url(self) -> str:
        return self._options.base_url

    @property
    def max_retries(self) -> int:
        return self._options.retry.max_retries

    async def request(
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
        """Send one request with retries; return a 2xx response or raise a typed error."""
        extra: dict[str, Any] = {} if isinstance(timeout, NotGiven) else {"timeout": timeout}
        request = self._http.build_request(method, path, json=json, params=params, headers=headers, **extra)
        policy = self._options.retry
        attempt = 0
        while True:
            try:
                response = await self._http.send(request, stream=stream)
            except httpx.TimeoutException as e:
                if attempt < policy.max_retries:
                    await _retry.async_sleep(_retry.retry_delay(attempt, policy))
                    attempt += 1
                    continue
                raise APITimeoutError(request=request) from e
            except httpx.TransportError as e:
                if attempt < policy.max_retries:
                    await _retry.async_sleep(_retry.retry_delay(attempt, policy))
                    attempt += 1
                    continue
                raise APIConnectionError(f"Connection error: {e!r}", request=request) from e
            if response.is_success:
                return response
            await response.aread()
            await response.aclose()
            if attempt < policy.max_retries and _retry.should_retry_status(response):
                await _retry.async_sleep(_retry.retry_delay(attempt, policy, response.headers))
                attempt += 1
                continue
            raise make_status_error(response)

    @overload
    async def generate(
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
    async def generate(
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
    ) -> AsyncGenerateStream: ...

    async def generate(
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
    ) -> GenerateResponse | AsyncGenerateStream:
        """``POST /v1/generate``; ``stream=True`` returns an :class:`AsyncGenerateStream`."""
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
            response = await self.request("POST", "/v1/generate", json=body, stream=True, headers=SSE, timeout=timeout)
            return AsyncGenerateStream(response)
        response = await self.request("POST", "/v1/generate", json=body, timeout=timeout)
        return parse_model(response, GenerateResponse)

    async def health(self) -> Health:
        return parse_model(await self.request("GET", "/health"), Health)

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncHypic:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncHypic(base_url={self.base_url!r}, max_retries={self.max_retries})"


class AsyncSegments:
    """Async ``/v1/segments`` (see :class:`hypic_client._resources.Segments`)."""

    def __init__(self, client: AsyncHypic) -> None:
        self._client = client

    async def put(
        self, segments: SegmentLike | Sequence[SegmentLike], *, timeout: TimeoutLike | NotGiven = NOT_GIVEN
    ) -> builtins.list[SegmentInfo]:
        body = {"segments": segments_to_wire(segments)}
        if not body["segments"]:
            raise ValueError("segments.put() needs at least one segment")
        response = await self._client.request("PUT", "/v1/segments", json=body, timeout=timeout)
        return parse_model_list(response, SegmentInfo)

    async def get(self, segment_id: str) -> SegmentInfo:
        return parse_model(await self._client.request("GET", segment_path(segment_id)), SegmentInfo)

    async def list(self, *, limit: int | None = None, after: str | None = None) -> SegmentPage:
        params = drop_none({"limit": limit, "after": after})
        return parse_model(await self._client.request("GET", "/v1/segments", params=params), SegmentPage)

    async def iter(self, *, limit: int | None = None) -> AsyncIterator[SegmentInfo]:
        after: str | None = None
        while True:
            page = await self.list(limit=limit, after=after)
            for item in page.data:
                yield item
            if not page.has_more or not page.next:
                return
            after = page.next

    async def update(self, segment_id: str, *, pin: bool | None = None, ttl: float | None = None) -> SegmentInfo:
        response = await self._client.request("PATCH", segment_path(segment_id), json=update_body(pin, ttl))
        return parse_model(response, SegmentInfo)

    async def delete(self, segment_id: str) -> SegmentDeleted:
        response = await self._client.request("DELETE", segment_path(segment_id))
        return deleted_from(response.status_code, response, segment_id)


class AsyncCompletions:
    def __init__(self, client: AsyncHypic) -> None:
        self._client = client

    async def create(
        self,
        *,
        messages: Sequence[Mapping[str, Any]],
        model: str | None = None,
        stream: bool = False,
        **kwargs: Any,
    ) -> ChatCompletion | AsyncChatCompletionStream:
        """``POST /v1/chat/completions`` (see the sync ``Completions``); ``stream=True`` returns an
        :class:`AsyncChatCompletionStream`."""
        body = chat_body(messages, model, stream, **kwargs)
        if stream:
            response = await self._client.request("POST", "/v1/chat/completions", json=body, stream=True, headers=SSE)
            return AsyncChatCompletionStream(response)
        return parse_model(await self._client.request("POST", "/v1/chat/completions", json=body), ChatCompletion)


class AsyncChat:
    def __init__(self, client: AsyncHypic) -> None:
        self.completions = AsyncCompletions(client)


class AsyncModels:
    def __init__(self, client: AsyncHypic) -> None:
        self._client = client

    async def list(self) -> ModelList:
        return parse_model(await self._client.request("GET", "/v1/models"), ModelList)

    async def retrieve(self, model_id: str) -> Model:
        return parse_model(await self._client.request("GET", f"/v1/models/{model_id}"), Model)
