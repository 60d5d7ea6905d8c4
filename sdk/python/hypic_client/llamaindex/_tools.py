"""``HypicLLM`` function calling: LlamaIndex tools over ``/v1/chat/completions``.

``chat(messages, tools=[...])`` (what ``FunctionCallingLLM.chat_with_tools`` and agents call)
sends OpenAI messages (an assistant's ``additional_kwargs["tool_calls"]`` and tool results
included) with the bound documents / segments in the ``segments`` extension; the reply's calls
are in ``message.additional_kwargs["tool_calls"]`` (OpenAI dicts), read back by
``tool_selections``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, ChatResponse, MessageRole
from llama_index.core.llms.llm import ToolSelection

from .._models import ChatCompletion
from .._segments import segments_to_wire
from ._convert import _ROLES

CHAT_KEYS = ("tools", "tool_choice", "parallel_tool_calls", "response_format")


def wants_chat_route(kwargs: dict[str, Any]) -> bool:
    return any(kwargs.get(k) is not None for k in ("tools", "response_format"))


def _call_dict(call: Any) -> dict[str, Any]:
    if hasattr(call, "model_dump"):
        call = call.model_dump()
    fn = dict(call.get("function") or {})
    args = fn.get("arguments", "{}")
    return {
        "id": call.get("id"),
        "type": "function",
        "function": {"name": fn.get("name", ""), "arguments": args if isinstance(args, str) else json.dumps(args)},
    }


def openai_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in messages:
        msg: dict[str, Any] = {"role": _ROLES.get(m.role, str(m.role.value)), "content": m.content or ""}
        calls = m.additional_kwargs.get("tool_calls")
        if calls:
            msg["tool_calls"] = [_call_dict(c) for c in calls]
        if msg["role"] == "tool" and m.additional_kwargs.get("tool_call_id"):
            msg["tool_call_id"] = m.additional_kwargs["tool_call_id"]
        out.append(msg)
    return out


def chat_body(messages: Sequence[ChatMessage], bound: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    body = {k: kwargs[k] for k in CHAT_KEYS if kwargs.get(k) is not None}
    body["messages"] = openai_messages(messages)
    if bound:
        body["segments"] = segments_to_wire(list(bound))
    return body


def tool_kwargs(
    tools: Sequence[Any],
    user_msg: str | ChatMessage | None,
    chat_history: list[ChatMessage] | None,
    allow_parallel_tool_calls: bool,
    tool_required: bool,
    tool_choice: Any,
) -> dict[str, Any]:
    """What ``_prepare_chat_with_tools`` returns: ``chat`` keyword arguments."""
    messages = list(chat_history or [])
    if user_msg is not None:
        messages.append(ChatMessage(role=MessageRole.USER, content=user_msg) if isinstance(user_msg, str) else user_msg)
    specs = [t.metadata.to_openai_tool() for t in tools]
    if isinstance(tool_choice, str) and tool_choice not in ("auto", "none", "required"):
        tool_choice = {"type": "function", "function": {"name": tool_choice}}
    choice = tool_choice or ("required" if tool_required else "auto")
    return {
        "messages": messages,
        "tools": specs,
        "tool_choice": choice,
        "parallel_tool_calls": allow_parallel_tool_calls,
    }


def chat_response(resp: ChatCompletion, extra: dict[str, Any]) -> ChatResponse:
    msg = resp.choices[0].message
    calls = [_call_dict(c) for c in msg.tool_calls or []]
    content = msg.content if isinstance(msg.content, str) else None
    message = ChatMessage(
        role=MessageRole.ASSISTANT, content=content, additional_kwargs={"tool_calls": calls} if calls else {}
    )
    return ChatResponse(message=message, raw=resp.model_dump(), additional_kwargs=extra)


def tool_selections(response: ChatResponse, error_on_no_tool_call: bool) -> list[ToolSelection]:
    calls = response.message.additional_kwargs.get("tool_calls") or []
    if not calls and error_on_no_tool_call:
        raise ValueError(f"expected at least one tool call, got: {response.message.content!r}")
    out = []
    for c in map(_call_dict, calls):
        try:
            args = json.loads(c["function"]["arguments"] or "{}")
        except ValueError:
            args = {}
        out.append(ToolSelection(tool_id=c["id"] or "", tool_name=c["function"]["name"], tool_kwargs=args))
    return out


def usage_extra(resp: ChatCompletion) -> dict[str, Any]:
    u = resp.usage
    if u is None:
        return {}
    cached = u.prompt_tokens_details.cached_tokens if u.prompt_tokens_details else 0
    return {
        "usage": {
            "prompt_tokens": u.prompt_tokens,
            "completion_tokens": u.completion_tokens,
            "total_tokens": u.total_tokens,
            "cached_tokens": cached,
        },
        "hypic": getattr(resp, "hypic", None),
    }
