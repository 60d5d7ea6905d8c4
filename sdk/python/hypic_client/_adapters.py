"""Framework-free helpers shared by the LangChain and LlamaIndex adapters.

Chat messages map onto segments the same way in both: system messages become ``system``
segments (first), bound documents/segments follow, earlier turns become one ``turn`` segment
each, and a final user message becomes the uncached ``query``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._async_client import AsyncHypic
from ._client import Hypic
from ._errors import APIResponseValidationError
from ._models import GenerateResponse, SegmentInfo, Usage
from ._segments import Segment, SegmentLike, system, to_segment, turn

SEGMENT_ID_KEY = "hypic_segment_id"
TOKENS_KEY = "hypic_tokens"


def resolve_clients(
    client: Hypic | None,
    async_client: AsyncHypic | None,
    base_url: str | None,
    api_key: str | None,
    timeout: float | None,
    max_retries: int,
) -> tuple[Hypic, AsyncHypic | None]:
    """Use the given clients, else build both from ``base_url``/``api_key``.

    When only a sync ``client`` is given (e.g. over a MockTransport) no async client is built:
    the async paths of the adapters then run the sync client in a thread.
    """
    if client is not None:
        return client, async_client
    sync = Hypic(base_url, api_key=api_key, timeout=timeout, max_retries=max_retries)
    return sync, async_client or AsyncHypic(base_url, api_key=api_key, timeout=timeout, max_retries=max_retries)


def text_segment(text: str, metadata: Mapping[str, Any] | None, kind: str, title_key: str) -> Segment:
    """A document's text as a segment of ``kind``; a stored id in its metadata wins (``ref``)."""
    metadata = metadata or {}
    sid = metadata.get(SEGMENT_ID_KEY)
    if isinstance(sid, str) and sid:
        return Segment(id=sid)
    title = metadata.get(title_key)
    return Segment.model_validate({"kind": kind, "text": text, "title": None if title is None else str(title)})


def with_cache(segment: Segment, pin: bool | None, ttl: float | None) -> Segment:
    if pin is None and ttl is None:
        return segment
    data = segment.to_wire()
    data["cache"] = {k: v for k, v in {"pin": pin, "ttl": ttl}.items() if v is not None}
    return Segment.model_validate(data)


def check_put(infos: Sequence[SegmentInfo], expected: int) -> None:
    if len(infos) != expected:
        raise APIResponseValidationError(f"PUT /v1/segments returned {len(infos)} entries for {expected} segments")


def tagged_metadata(metadata: Mapping[str, Any], info: SegmentInfo) -> dict[str, Any]:
    out = {**metadata, SEGMENT_ID_KEY: info.id}
    if info.tokens is not None:
        out[TOKENS_KEY] = info.tokens
    return out


@dataclass
class ChatPlan:
    """A chat turned into ``generate()`` arguments: ``segments`` then ``query``."""

    segments: list[Segment] = field(default_factory=list)
    query: str | None = None


def plan_chat(
    messages: Sequence[tuple[str, str]],
    bound: Sequence[SegmentLike] = (),
) -> ChatPlan:
    """``(role, text)`` pairs -> segments + query (see module docstring for the order)."""
    if not messages:
        raise ValueError("need at least one message")
    # NOTE: messages with no text (e.g. an assistant message holding only tool calls) carry nothing
    # the server can frame, and it rejects empty turn content, so they are dropped.
    messages = [(role, text) for role, text in messages if text.strip()]
    systems = [system(text) for role, text in messages if role == "system"]
    rest = [(role, text) for role, text in messages if role != "system"]
    query = None
    if rest and rest[-1][0] == "user":
        query = rest.pop()[1]
    turns = [turn(role, text) for role, text in rest]
    return ChatPlan([*systems, *(to_segment(s) for s in bound), *turns], query)


def usage_dict(usage: Usage) -> dict[str, Any]:
    """Usage in the shape both frameworks log (token counts plus cache reads)."""
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "cached_tokens": usage.cached_tokens,
        "recomputed_tokens": usage.recomputed_tokens,
    }


def response_metadata(resp: GenerateResponse) -> dict[str, Any]:
    return {
        "id": resp.id,
        "finish_reason": resp.finish_reason,
        "usage": usage_dict(resp.usage),
        "segments": [s.model_dump() for s in resp.usage.segments],
        "timings": resp.timings.model_dump(),
    }


def sampling_kwargs(source: Any, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Sampling fields of an adapter object, overridden by per-call keyword arguments."""
    names = ("mode", "seam", "max_tokens", "temperature", "top_p", "top_k")
    out = {n: overrides.get(n, getattr(source, n, None)) for n in names}
    return {k: v for k, v in out.items() if v is not None}
