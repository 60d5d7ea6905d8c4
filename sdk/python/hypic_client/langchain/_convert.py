"""LangChain objects -> hypic segments."""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.documents import Document
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.messages.ai import InputTokenDetails, UsageMetadata

from .._adapters import ChatPlan, plan_chat, text_segment
from .._models import Usage
from .._segments import Segment, SegmentLike, to_segment

DocumentLike = Document | SegmentLike


def document_to_segment(document: DocumentLike, kind: str = "document", title_key: str = "title") -> Segment:
    """A Document or str -> ``kind`` segment (a ``ref`` if it carries ``hypic_segment_id``); dict/Segment as is."""
    if isinstance(document, Document):
        return text_segment(document.page_content, document.metadata, kind, title_key)
    if isinstance(document, str):
        return text_segment(document, None, kind, title_key)
    return to_segment(document)


def documents_to_segments(
    documents: Sequence[DocumentLike], kind: str = "document", title_key: str = "title"
) -> list[Segment]:
    return [document_to_segment(d, kind, title_key) for d in documents]


def _role(message: BaseMessage) -> str:
    if isinstance(message, SystemMessage):
        return "system"
    if isinstance(message, HumanMessage):
        return "user"
    if isinstance(message, AIMessage):
        return "assistant"
    if isinstance(message, ToolMessage):
        return "tool"
    if isinstance(message, ChatMessage):
        return {"human": "user", "ai": "assistant"}.get(message.role, message.role)
    raise TypeError(f"unsupported message type {type(message).__name__}; use System/Human/AI/Tool/ChatMessage")


def messages_to_plan(messages: Sequence[BaseMessage], bound: Sequence[SegmentLike] = ()) -> ChatPlan:
    """Messages (+ already-converted bound segments) -> ``ChatPlan(segments, query)``."""
    return plan_chat([(_role(m), str(m.text)) for m in messages], bound)


def usage_metadata(usage: Usage) -> UsageMetadata:
    """LangChain ``UsageMetadata`` with the cache reads the server reported."""
    return UsageMetadata(
        input_tokens=usage.prompt_tokens,
        output_tokens=usage.completion_tokens,
        total_tokens=usage.total_tokens,
        input_token_details=InputTokenDetails(cache_read=usage.cached_tokens),
    )
