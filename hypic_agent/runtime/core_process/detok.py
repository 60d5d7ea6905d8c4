"""``Detokenizer``: the API process's side of a request's text.

With the engine in its own process, a request without stop strings goes to the engine with
``SamplingParams.detokenize`` off: its events carry token ids and empty text, and the text is made
here, in the API process, from the ids as they arrive (``stopping.StopChecker`` without stop
strings: the same incremental decode the engine would run, so the text is the same to the
character). The engine's host loop then spends nothing on text for them. A request with stop
strings keeps its text in the engine, which must see it to stop.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hypic_agent.runtime.results import FinishEvent, TokenEvent
from hypic_agent.runtime.stopping import StopChecker


class Detokenizer:
    """One request's events with empty text -> the same events with their text."""

    def __init__(self, tokenizer: Any) -> None:
        self._text = StopChecker(tokenizer)
        self._parts: list[str] = []

    def events(self, item: Any) -> list[Any]:
        """The events to deliver for ``item`` (a token: its text filled in; the finish: the held-back
        text as a token event of its own, then the finish with the whole text; anything else as is)."""
        if isinstance(item, TokenEvent) and item.token_id is not None:
            piece = self._text.push(item.token_id)
            if piece:
                self._parts.append(piece)
            return [dataclasses.replace(item, text=piece)]
        if isinstance(item, FinishEvent):
            out: list[Any] = []
            tail = self._text.flush()
            if tail:
                self._parts.append(tail)
                out.append(TokenEvent(tail, None, None))
            out.append(dataclasses.replace(item, text="".join(self._parts)))
            return out
        return [item]
