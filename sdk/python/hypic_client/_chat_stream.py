"""Streams of ``chat.completions.create(stream=True)`` that also add the chunks up.

``final_response()`` drains the stream into the :class:`ChatCompletion` the non-streaming call
returns: content joined, tool-call deltas merged by ``index`` (name and argument pieces
concatenated), finish reason, usage (with ``stream_options={"include_usage": True}``) and the
server's ``hypic`` usage and timings.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx

from ._models import ChatCompletion, ChatCompletionChunk
from ._streaming import AsyncStream, Stream


class _ChatAccumulator:
    def __init__(self) -> None:
        self.parts: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.last: ChatCompletionChunk | None = None
        self.usage: Any = None
        self.hypic: Any = None

    def add(self, chunk: ChatCompletionChunk) -> None:
        self.last = chunk
        self.usage = chunk.usage or self.usage
        self.hypic = getattr(chunk, "hypic", None) or self.hypic
        for choice in chunk.choices:
            delta = choice.delta
            if delta.content:
                self.parts.append(delta.content)
            for tc in delta.tool_calls or []:
                call = self.calls.setdefault(tc.index, {"id": None, "type": "function", "name": "", "arguments": ""})
                call["id"] = tc.id or call["id"]
                if tc.function is not None:
                    call["name"] += tc.function.name or ""
                    call["arguments"] += tc.function.arguments or ""
            self.finish_reason = choice.finish_reason or self.finish_reason

    def response(self) -> ChatCompletion:
        calls = [
            {"id": c["id"], "type": c["type"], "function": {"name": c["name"], "arguments": c["arguments"]}}
            for _, c in sorted(self.calls.items())
        ]
        content = "".join(self.parts)
        message: dict[str, Any] = {"role": "assistant", "content": content or (None if calls else "")}
        if calls:
            message["tool_calls"] = calls
        last = self.last
        data: dict[str, Any] = {
            "id": last.id if last else None,
            "created": last.created if last else None,
            "model": last.model if last else None,
            "choices": [{"index": 0, "message": message, "finish_reason": self.finish_reason}],
            "usage": self.usage,
        }
        if self.hypic is not None:
            data["hypic"] = self.hypic
        return ChatCompletion.model_validate(data)


class ChatCompletionStream(Stream[ChatCompletionChunk]):
    """Chunks of a streamed chat completion; ``final_response()`` adds them up."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(response, ChatCompletionChunk)
        self._acc = _ChatAccumulator()

    def _on_item(self, item: ChatCompletionChunk) -> None:
        self._acc.add(item)

    def text_deltas(self) -> Iterator[str]:
        for chunk in self:
            for choice in chunk.choices:
                if choice.delta.content:
                    yield choice.delta.content

    def final_response(self) -> ChatCompletion:
        for _ in self:
            pass
        return self._acc.response()


class AsyncChatCompletionStream(AsyncStream[ChatCompletionChunk]):
    """Async twin of :class:`ChatCompletionStream`."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(response, ChatCompletionChunk)
        self._acc = _ChatAccumulator()

    def _on_item(self, item: ChatCompletionChunk) -> None:
        self._acc.add(item)

    async def text_deltas(self) -> AsyncIterator[str]:
        async for chunk in self:
            for choice in chunk.choices:
                if choice.delta.content:
                    yield choice.delta.content

    async def final_response(self) -> ChatCompletion:
        async for _ in self:
            pass
        return self._acc.response()
