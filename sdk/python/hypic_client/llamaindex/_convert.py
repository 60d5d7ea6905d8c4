"""LlamaIndex nodes and messages -> hypic segments."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.schema import BaseNode, MetadataMode, NodeWithScore, TextNode

from .._adapters import SEGMENT_ID_KEY, TOKENS_KEY, ChatPlan, plan_chat, text_segment
from .._segments import Segment, to_segment

HIDDEN_KEYS = (SEGMENT_ID_KEY, TOKENS_KEY)


def as_node(value: BaseNode | NodeWithScore | str) -> BaseNode:
    if isinstance(value, NodeWithScore):
        return value.node
    if isinstance(value, str):
        return TextNode(text=value)
    return value


def node_to_segment(value: Any, kind: str = "document", title_key: str = "title") -> Segment:
    """Node / NodeWithScore / str -> ``kind`` segment (a ``ref`` when tagged); dict/Segment as is."""
    if isinstance(value, (BaseNode, NodeWithScore, str)):
        node = as_node(value)
        return text_segment(node.get_content(metadata_mode=MetadataMode.NONE), node.metadata, kind, title_key)
    return to_segment(value)


def nodes_to_segments(values: Sequence[Any], kind: str = "document", title_key: str = "title") -> list[Segment]:
    return [node_to_segment(v, kind, title_key) for v in values]


_ROLES = {
    MessageRole.SYSTEM: "system",
    MessageRole.DEVELOPER: "system",
    MessageRole.USER: "user",
    MessageRole.ASSISTANT: "assistant",
    MessageRole.TOOL: "tool",
    MessageRole.FUNCTION: "tool",
    MessageRole.CHATBOT: "assistant",
    MessageRole.MODEL: "assistant",
}


def messages_to_plan(messages: Sequence[ChatMessage], bound: Sequence[Any] = ()) -> ChatPlan:
    pairs = [(_ROLES.get(m.role, str(m.role.value)), m.content or "") for m in messages]
    return plan_chat(pairs, bound)
