"""Endpoint groups hung on the sync client: ``client.segments``, ``client.chat.completions``, ``client.models``."""

from __future__ import annotations

import builtins
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, overload

from ._base import (
    NOT_GIVEN,
    SSE,
    NotGiven,
    TimeoutLike,
    drop_none,
    parse_json,
    parse_model,
    parse_model_list,
    segment_path,
    update_body,
)
from ._chat_stream import ChatCompletionStream
from ._models import ChatCompletion, Model, ModelList, SegmentDeleted, SegmentInfo, SegmentPage
from ._segments import SegmentLike, segments_to_wire
from ._tools import output_params

if TYPE_CHECKING:
    from ._client import Hypic


class Segments:
    """``/v1/segments``: store (and pre-warm) segments, inspect, pin, delete.

    Stored ids are content addressed: putting the same text twice returns the same id.
    """

    def __init__(self, client: Hypic) -> None:
        self._client = client

    def put(
        self, segments: SegmentLike | Sequence[SegmentLike], *, timeout: TimeoutLike | NotGiven = NOT_GIVEN
    ) -> builtins.list[SegmentInfo]:
        """``PUT /v1/segments``: register segments; returns one :class:`SegmentInfo` per input, in order."""
        body = {"segments": segments_to_wire(segments)}
        if not body["segments"]:
            raise ValueError("segments.put() needs at least one segment")
        response = self._client.request("PUT", "/v1/segments", json=body, timeout=timeout)
        return parse_model_list(response, SegmentInfo)

    def get(self, segment_id: str) -> SegmentInfo:
        """``GET /v1/segments/{id}``; raises :class:`NotFoundError` for unknown ids."""
        return parse_model(self._client.request("GET", segment_path(segment_id)), SegmentInfo)

    def list(self, *, limit: int | None = None, after: str | None = None) -> SegmentPage:
        """``GET /v1/segments?limit=&after=``: one page; ``page.next`` is the cursor of the next."""
        params = drop_none({"limit": limit, "after": after})
        return parse_model(self._client.request("GET", "/v1/segments", params=params), SegmentPage)

    def iter(self, *, limit: int | None = None) -> Iterator[SegmentInfo]:
        """All stored segments of this tenant, following the cursor page by page."""
        after: str | None = None
        while True:
            page = self.list(limit=limit, after=after)
            yield from page.data
            if not page.has_more or not page.next:
                return
            after = page.next

    def update(self, segment_id: str, *, pin: bool | None = None, ttl: float | None = None) -> SegmentInfo:
        """``PATCH /v1/segments/{id}`` with ``{"cache": {"pin", "ttl"}}``: pin/unpin or set a TTL."""
        response = self._client.request("PATCH", segment_path(segment_id), json=update_body(pin, ttl))
        return parse_model(response, SegmentInfo)

    def delete(self, segment_id: str) -> SegmentDeleted:
        """``DELETE /v1/segments/{id}``."""
        response = self._client.request("DELETE", segment_path(segment_id))
        return deleted_from(response.status_code, response, segment_id)


def deleted_from(status: int, response: Any, segment_id: str) -> SegmentDeleted:
    """204/empty body -> ``{"id", "deleted": true}``; else the server's JSON."""
    if status == 204 or not response.content:
        return SegmentDeleted(id=segment_id, deleted=True)
    data = parse_json(response)
    if isinstance(data, dict):
        data = {"id": segment_id, "deleted": True, **data}
    return SegmentDeleted.model_validate(data)


def chat_body(messages: Sequence[Mapping[str, Any]], model: str | None, stream: bool, **kwargs: Any) -> dict:
    if not messages:
        raise ValueError("chat.completions.create() needs at least one message")
    body: dict[str, Any] = {"messages": [dict(m) for m in messages], "stream": stream}
    if model is not None:
        body["model"] = model
    if kwargs.get("segments") is not None:  # the chat route's extension: cached segments after the system messages
        kwargs = {**kwargs, "segments": segments_to_wire(kwargs["segments"])}
    body.update(drop_none(output_params(kwargs)))
    return body


class Completions:
    """``POST /v1/chat/completions`` (OpenAI-compatible). Extra keyword arguments go into the body:
    ``tools``, ``tool_choice``, ``parallel_tool_calls``, ``response_format`` (pydantic classes
    accepted, see ``_tools.py``), ``logprobs`` / ``top_logprobs``, ``segments``, ``mode``..."""

    def __init__(self, client: Hypic) -> None:
        self._client = client

    @overload
    def create(
        self,
        *,
        messages: Sequence[Mapping[str, Any]],
        model: str | None = ...,
        stream: Literal[False] = ...,
        **kwargs: Any,
    ) -> ChatCompletion: ...

    @overload
    def create(
        self, *, messages: Sequence[Mapping[str, Any]], model: str | None = ..., stream: Literal[True], **kwargs: Any
    ) -> ChatCompletionStream: ...

    def create(
        self,
        *,
        messages: Sequence[Mapping[str, Any]],
        model: str | None = None,
        stream: bool = False,
        **kwargs: Any,
    ) -> ChatCompletion | ChatCompletionStream:
        body = chat_body(messages, model, stream, **kwargs)
        if stream:
            response = self._client.request("POST", "/v1/chat/completions", json=body, stream=True, headers=SSE)
            return ChatCompletionStream(response)
        return parse_model(self._client.request("POST", "/v1/chat/completions", json=body), ChatCompletion)


class Chat:
    def __init__(self, client: Hypic) -> None:
        self.completions = Completions(client)


class Models:
    def __init__(self, client: Hypic) -> None:
        self._client = client

    def list(self) -> ModelList:
        """``GET /v1/models``."""
        return parse_model(self._client.request("GET", "/v1/models"), ModelList)

    def retrieve(self, model_id: str) -> Model:
        """``GET /v1/models/{id}``; raises :class:`NotFoundError` for a model the server does not serve."""
        return parse_model(self._client.request("GET", f"/v1/models/{model_id}"), Model)
