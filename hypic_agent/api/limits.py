"""Size limits checked at the edge, after parsing and before anything is tokenized or stored.

* text: a prompt (or, for ``PUT /v1/segments``, one segment) whose characters exceed
  ``max_context x Settings.text_chars_per_token`` cannot fit the context window however it
  tokenizes, so it is refused before the tokenizer sees it (400 ``context_length_exceeded``);
* metadata: each segment's ``metadata`` at most ``Settings.max_metadata_depth`` levels deep and
  ``Settings.max_metadata_bytes`` as JSON (400 ``invalid_request``), so nothing is stored that
  a later listing could not serialize;
* schemas: a tool's ``parameters`` and a ``response_format`` schema at most
  ``Settings.max_schema_depth`` levels deep (a grammar is compiled from them).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from hypic_agent.config import Settings
from hypic_agent.errors import ContextLengthError, InvalidRequestError
from hypic_agent.wire import json_depth


def segment_chars(seg: Any) -> int:
    """Characters of a wire segment's content (text, or its messages' contents)."""
    text = getattr(seg, "text", None)
    if text is not None:
        return len(text)
    return sum(len(m.content) for m in getattr(seg, "messages", None) or ())


def check_metadata(settings: Settings, metadata: Any, param: str) -> None:
    if not metadata:
        return
    depth = json_depth(metadata)
    if depth > settings.max_metadata_depth:
        raise InvalidRequestError(
            f"metadata nests {depth} levels deep; the limit is {settings.max_metadata_depth} "
            "(HYPIC_MAX_METADATA_DEPTH)",
            param=param,
        )
    size = len(json.dumps(metadata, ensure_ascii=False).encode())
    if size > settings.max_metadata_bytes:
        raise InvalidRequestError(
            f"metadata is {size} bytes as JSON; the limit is {settings.max_metadata_bytes} (HYPIC_MAX_METADATA_BYTES)",
            param=param,
        )


class RequestLimits:
    """The limits of one server: ``settings`` and the engine's context window."""

    def __init__(self, settings: Settings, max_context: int) -> None:
        self.settings = settings
        self.max_chars = max_context * settings.text_chars_per_token
        self.max_context = max_context

    def check_chars(self, chars: int, what: str, param: str) -> None:
        if chars > self.max_chars:
            raise ContextLengthError(
                f"{what} has {chars} characters: more than fit the context window of {self.max_context} tokens at "
                f"{self.settings.text_chars_per_token} characters per token ({self.max_chars}); refused before "
                "tokenizing: send less text (or raise HYPIC_TEXT_CHARS_PER_TOKEN)",
                param=param,
            )

    def check_segments(self, segments: Sequence[Any], *, extra_chars: int = 0, each: bool = False) -> None:
        """Metadata of every segment; text per segment (``each``, for PUT) or of the whole prompt."""
        total = extra_chars
        for i, seg in enumerate(segments):
            check_metadata(self.settings, getattr(seg, "metadata", None), f"segments.{i}.metadata")
            n = segment_chars(seg)
            if each:
                self.check_chars(n, f"segments[{i}]", f"segments.{i}")
            total += n
        if not each:
            self.check_chars(total, "the prompt", "segments")

    def check_schema(self, schema: Any, param: str) -> None:
        depth = json_depth(schema) if schema else 0
        if depth > self.settings.max_schema_depth:
            raise InvalidRequestError(
                f"the schema nests {depth} levels deep; the limit is {self.settings.max_schema_depth} "
                "(HYPIC_MAX_SCHEMA_DEPTH)",
                param=param,
            )

    def check_prompt(self, segments: Sequence[Any], texts: Iterable[str | None]) -> None:
        """A generate / chat request: its segments plus the other texts (query, messages)."""
        self.check_segments(segments, extra_chars=sum(len(t) for t in texts if t))
