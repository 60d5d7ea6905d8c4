"""``ChatHypic`` with tools or structured output: requests go to ``/v1/chat/completions``.

The messages go as OpenAI messages (an ``AIMessage``'s ``tool_calls`` and ``ToolMessage`` results
included) and the bound documents / segments in the chat route's ``segments`` extension, placed
after the system messages as on the native route, so the cache sees the same segments. Tool
definitions become segments on the server (one per function), cached like any other.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, convert_to_openai_messages
from langchain_core.messages.ai import InputTokenDetails, UsageMetadata
from langchain_core.messages.tool import tool_call_chunk
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.utils.function_calling import convert_to_openai_tool

from .._models import ChatCompletion, ChatCompletionChunk, ChatUsage
from .._segments import SegmentLike, segments_to_wire

CHAT_KEYS = ("tools", "tool_choice", "parallel_tool_calls", "response_format")


def wants_chat_route(kwargs: dict[str, Any]) -> bool:
    return any(kwargs.get(k) is not None for k in ("tools", "response_format"))


def tool_choice_of(choice: Any, tools: Sequence[dict[str, Any]]) -> Any:
    """LangChain's tool_choice spellings -> OpenAI's (``"any"``/``True``: a call is required; with
    one tool that tool is named, so exactly one call comes back)."""
    if choice is None or isinstance(choice, dict) or choice in ("auto", "none"):
        return choice
    if choice in ("any", "required", True):
        if len(tools) == 1:
            return {"type": "function", "function": {"name": tools[0]["function"]["name"]}}
        return "required"
    if isinstance(choice, str):
        return {"type": "function", "function": {"name": choice}}
    raise ValueError(f"unsupported tool_choice {choice!r}")


def format_tools(tools: Sequence[Any]) -> list[dict[str, Any]]:
    return [convert_to_openai_tool(t) for t in tools]


def chat_body(messages: list[BaseMessage], bound: Sequence[SegmentLike], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments for ``client.chat.completions.create``."""
    body = {k: kwargs[k] for k in CHAT_KEYS if kwargs.get(k) is not None}
    body["messages"] = convert_to_openai_messages(messages)
    if bound:
        body["segments"] = segments_to_wire(list(bound))
    return body


def _usage(usage: ChatUsage | None) -> UsageMetadata | None:
    if usage is None:
        return None
    cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
    return UsageMetadata(
        input_tokens=usage.prompt_tokens,
        output_tokens=usage.completion_tokens,
        total_tokens=usage.prompt_tokens + usage.completion_tokens,
        input_token_details=InputTokenDetails(cache_read=cached),
    )


def _args(text: str) -> Any:
    try:
        return json.loads(text or "{}")
    except ValueError:
        return {}


def chat_result(resp: ChatCompletion) -> ChatResult:
    choice = resp.choices[0]
    msg = choice.message
    calls = [
        {"name": c.function.name, "args": _args(c.function.arguments), "id": c.id, "type": "tool_call"}
        for c in msg.tool_calls or []
    ]
    meta = {"id": resp.id, "finish_reason": choice.finish_reason, "model_provider": "hypic"}
    hypic = getattr(resp, "hypic", None)
    if hypic is not None:
        meta["hypic"] = hypic
    message = AIMessage(
        content=msg.content if isinstance(msg.content, str) else "",
        tool_calls=calls,
        usage_metadata=_usage(resp.usage),
        response_metadata=meta,
    )
    info = {"finish_reason": choice.finish_reason}
    return ChatResult(generations=[ChatGeneration(message=message, generation_info=info)])


def chat_chunk(chunk: ChatCompletionChunk) -> ChatGenerationChunk | None:
    if not chunk.choices:  # the include_usage chunk
        return None
    choice = chunk.choices[0]
    delta = choice.delta
    calls = [
        tool_call_chunk(
            name=tc.function.name if tc.function else None,
            args=tc.function.arguments if tc.function else None,
            id=tc.id,
            index=tc.index,
        )
        for tc in delta.tool_calls or []
    ]
    info = {"finish_reason": choice.finish_reason} if choice.finish_reason else None
    message = AIMessageChunk(
        content=delta.content or "",
        tool_call_chunks=calls,
        response_metadata={"finish_reason": choice.finish_reason, "model_provider": "hypic"} if info else {},
        chunk_position="last" if info else None,
    )
    return ChatGenerationChunk(message=message, generation_info=info)
