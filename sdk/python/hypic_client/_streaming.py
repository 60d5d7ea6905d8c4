"""Server-sent events: a line decoder and typed (async) iterators over a streaming response.

Wire format (``POST /v1/generate`` with ``"stream": true``, and the OpenAI-compatible chat route):
``data: {json}`` events separated by blank lines, the last JSON event carrying ``usage`` and
``timings``, then ``data: [DONE]``. Comments (``: ping``), ``event:``/``id:``/``retry:`` fields
and multi-line ``data:`` are handled per the SSE spec. An event named ``error``, or a JSON payload
with a non-empty ``error`` member, raises :class:`APIStreamError`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from ._errors import (
    APIConnectionError,
    APIResponseValidationError,
    APIStreamError,
    APITimeoutError,
    parse_error_payload,
)
from ._models import GenerateChunk, GenerateResponse, TokenLogprob, Usage

T = TypeVar("T", bound=BaseModel)
DONE = "[DONE]"


@dataclass
class ServerSentEvent:
    data: str
    event: str | None = None
    id: str | None = None
    retry: int | None = None

    def json(self) -> Any:
        return json.loads(self.data)


@dataclass
class SSEDecoder:
    """Feed lines (without their line terminator); get an event back at each blank line."""

    _data: list[str] = field(default_factory=list)
    _event: str | None = None
    _id: str | None = None
    _retry: int | None = None

    def decode(self, line: str) -> ServerSentEvent | None:
        line = line.rstrip("\r\n")
        if not line:
            return self.flush()
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._id = value
        elif name == "retry" and value.isdigit():
            self._retry = int(value)
        return None

    def flush(self) -> ServerSentEvent | None:
        """Dispatch what is buffered (at a blank line, or at end of stream)."""
        if not self._data and self._event is None:
            return None
        sse = ServerSentEvent("\n".join(self._data), self._event, self._id, self._retry)
        self._data, self._event, self._retry = [], None, None
        return sse


def iter_events(lines: Iterable[str]) -> Iterator[ServerSentEvent]:
    decoder = SSEDecoder()
    for line in lines:
        sse = decoder.decode(line)
        if sse is not None:
            yield sse
    tail = decoder.flush()
    if tail is not None:
        yield tail


async def aiter_events(lines: AsyncIterable[str]) -> AsyncIterator[ServerSentEvent]:
    decoder = SSEDecoder()
    async for line in lines:
        sse = decoder.decode(line)
        if sse is not None:
            yield sse
    tail = decoder.flush()
    if tail is not None:
        yield tail


def decode_event(sse: ServerSentEvent, cast: type[T], request: httpx.Request | None) -> T | None:
    """The typed payload of one event; ``None`` for ``[DONE]``; raises on error events."""
    if sse.data.strip() == DONE:
        return None
    try:
        payload = sse.json()
    except ValueError as e:
        raise APIResponseValidationError(f"stream event is not JSON: {sse.data[:200]!r}", request=request) from e
    if sse.event == "error" or (isinstance(payload, dict) and payload.get("error")):
        error_type, message, param = parse_error_payload(payload)
        raise APIStreamError(
            message or "the server reported an error in the stream",
            request=request,
            body=payload,
            error_type=error_type,
            param=param,
        )
    try:
        return cast.model_validate(payload)
    except ValidationError as e:
        raise APIResponseValidationError(
            f"stream event does not match {cast.__name__}: {e}", request=request, body=payload
        ) from e


def _transport_error(e: httpx.TransportError, request: httpx.Request) -> APIConnectionError:
    if isinstance(e, httpx.TimeoutException):
        return APITimeoutError("Timed out while reading the stream.", request=request)
    return APIConnectionError(f"Connection lost while reading the stream: {e}", request=request)


class Stream(Generic[T]):
    """Iterator of typed events over one streaming response. Closes the response when exhausted."""

    def __init__(self, response: httpx.Response, cast: type[T]) -> None:
        self.response = response
        self._cast = cast
        self._iterator = self._events()

    def _events(self) -> Iterator[T]:
        request = self.response.request
        try:
            for sse in iter_events(self.response.iter_lines()):
                item = decode_event(sse, self._cast, request)
                if item is None:
                    break
                self._on_item(item)
                yield item
        except httpx.TransportError as e:
            raise _transport_error(e, request) from e
        finally:
            self.response.close()

    def _on_item(self, item: T) -> None:
        """Hook for subclasses that accumulate."""

    def __iter__(self) -> Iterator[T]:
        return self._iterator

    def __next__(self) -> T:
        return next(self._iterator)

    def close(self) -> None:
        self.response.close()

    def __enter__(self) -> Stream[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncStream(Generic[T]):
    """Async iterator of typed events over one streaming response."""

    def __init__(self, response: httpx.Response, cast: type[T]) -> None:
        self.response = response
        self._cast = cast
        self._iterator = self._events()

    async def _events(self) -> AsyncIterator[T]:
        request = self.response.request
        try:
            async for sse in aiter_events(self.response.aiter_lines()):
                item = decode_event(sse, self._cast, request)
                if item is None:
                    break
                self._on_item(item)
                yield item
        except httpx.TransportError as e:
            raise _transport_error(e, request) from e
        finally:
            await self.response.aclose()

    def _on_item(self, item: T) -> None:
        """Hook for subclasses that accumulate."""

    def __aiter__(self) -> AsyncIterator[T]:
        return self._iterator

    async def __anext__(self) -> T:
        return await self._iterator.__anext__()

    async def close(self) -> None:
        await self.response.aclose()

    async def __aenter__(self) -> AsyncStream[T]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class _GenerateAccumulator:
    """Folds generate chunks into the equivalent non-streaming :class:`GenerateResponse`."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.logprobs: list[TokenLogprob] = []
        self.last: GenerateChunk | None = None
        self.usage: Usage | None = None
        self.finish_reason: str | None = None
        self.timings: Any = None
        self.id: str | None = None

    def add(self, chunk: GenerateChunk) -> None:
        self.parts.append(chunk.text)
        if chunk.logprob is not None or chunk.token_id is not None:
            self.logprobs.append(TokenLogprob(token=chunk.text, token_id=chunk.token_id, logprob=chunk.logprob))
        self.id = chunk.id or self.id
        self.finish_reason = chunk.finish_reason or self.finish_reason
        self.usage = chunk.usage or self.usage
        self.timings = chunk.timings or self.timings

    def response(self) -> GenerateResponse:
        data: dict[str, Any] = {"id": self.id, "text": "".join(self.parts), "finish_reason": self.finish_reason}
        if self.usage is not None:
            data["usage"] = self.usage
        if self.timings is not None:
            data["timings"] = self.timings
        if any(lp.logprob is not None for lp in self.logprobs):
            data["logprobs"] = self.logprobs
        return GenerateResponse.model_validate(data)


class GenerateStream(Stream[GenerateChunk]):
    """Chunks of ``generate(stream=True)``; ``final_response()`` drains it into a GenerateResponse."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(response, GenerateChunk)
        self._acc = _GenerateAccumulator()

    def _on_item(self, item: GenerateChunk) -> None:
        self._acc.add(item)

    @property
    def text(self) -> str:
        """Text received so far."""
        return "".join(self._acc.parts)

    def text_deltas(self) -> Iterator[str]:
        for chunk in self:
            if chunk.text:
                yield chunk.text

    def final_response(self) -> GenerateResponse:
        for _ in self:
            pass
        return self._acc.response()


class AsyncGenerateStream(AsyncStream[GenerateChunk]):
    """Async twin of :class:`GenerateStream`."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(response, GenerateChunk)
        self._acc = _GenerateAccumulator()

    def _on_item(self, item: GenerateChunk) -> None:
        self._acc.add(item)

    @property
    def text(self) -> str:
        return "".join(self._acc.parts)

    async def text_deltas(self) -> AsyncIterator[str]:
        async for chunk in self:
            if chunk.text:
                yield chunk.text

    async def final_response(self) -> GenerateResponse:
        async for _ in self:
            pass
        return self._acc.response()
