"""The chat response's output side: content, tool calls and logprobs in OpenAI's shapes.

``ChatOutput`` turns generated text into message deltas (streaming) or one message (whole body)
through the same ``CallParser``, so a stream's deltas add up to the non-streaming message. With
tools active (given, and ``tool_choice`` is not ``none``) calls are parsed out of the text and the
finish reason is ``tool_calls`` when there is at least one; otherwise the text is the content.

A forced call (``tool_choice`` ``required`` / a named function) returns calls only: what is not
a complete call (a call cut off by ``max_tokens``, the separators between calls) is never
content, and a call equal to one already returned (same function, same arguments: the repeat
that ended decoding, ``tools/grammar.py``) is not returned again, in a stream as in a body. The
finish reason is ``tool_calls`` when at least one call is complete (a cut-off call after it is
dropped), else the engine's (``length``), with no calls and empty content.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypic_agent.api.chat_job import ChatJob
from hypic_agent.tools.parse import CallParser
from hypic_agent.tools.spec import ToolCall


def _token(tok: Any, token_id: int, logprob: float) -> dict[str, Any]:
    text = tok.decode([token_id])
    return {"token": text, "logprob": logprob, "bytes": list(text.encode())}


def logprob_entry(tok: Any, token_id: int, logprob: float, top: Sequence[tuple[int, float]] | None) -> dict[str, Any]:
    """One ``logprobs.content`` item: the token, its logprob, and the most likely alternatives."""
    return {**_token(tok, token_id, logprob), "top_logprobs": [_token(tok, t, lp) for t, lp in top or ()]}


def logprobs_content(
    tok: Any, ids: Sequence[int], lps: Sequence[float], tops: Sequence[Sequence[tuple[int, float]]]
) -> dict[str, Any]:
    return {
        "content": [
            logprob_entry(tok, t, lp, tops[i] if i < len(tops) else None)
            for i, (t, lp) in enumerate(zip(ids, lps, strict=False))
        ]
    }


class ChatOutput:
    def __init__(self, cj: ChatJob) -> None:
        self.parser = CallParser(cj.fmt.syntax, cj.tools.functions) if cj.tools.active else None
        self.forced = cj.tools.choice.forces_call
        self.calls: list[ToolCall] = []
        self.content: list[str] = []

    def feed(self, text: str) -> list[dict[str, Any]]:
        """Deltas released by this much more text: ``{"content": ...}`` / ``{"tool_calls": [...]}``."""
        if self.parser is None:
            return self._deltas([text] if text else [])
        return self._deltas(self.parser.feed(text))

    def finish(self) -> list[dict[str, Any]]:
        return [] if self.parser is None else self._deltas(self.parser.flush())

    def _deltas(self, pieces: Sequence[str | ToolCall]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for p in pieces:
            if isinstance(p, ToolCall):
                if self.forced and any((c.name, c.arguments) == (p.name, p.arguments) for c in self.calls):
                    continue
                out.append({"tool_calls": [p.openai(index=len(self.calls))]})
                self.calls.append(p)
            elif p and not self.forced:
                self.content.append(p)
                out.append({"content": p})
        return out

    def message(self, text: str) -> dict[str, Any]:
        """The whole message for ``text`` (non-streaming)."""
        self.feed(text)
        self.finish()
        content = "".join(self.content)
        msg: dict[str, Any] = {"role": "assistant", "content": content or (None if self.calls else "")}
        if self.calls:
            msg["tool_calls"] = [c.openai() for c in self.calls]
        return msg

    def finish_reason(self, engine_reason: str) -> str:
        return "tool_calls" if self.calls else engine_reason
