"""Incremental detokenization with stop strings.

Each generated token decodes only a short window of ids (the tokens since the last released text
plus the chunk before it, for context such as a leading space), not the whole output, and only the
text held back is kept (fewer characters than the longest stop string): a step of a batch of long
answers stays O(1) per request instead of O(length). Text is released only when it is complete (no
dangling multi-byte sequence) and can no longer be the start of a stop string; the output is cut at
the first stop string.

The window's text is ``tokenizer.decode(ids, skip_special_tokens=True)``; for a transformers fast
tokenizer that call is the Rust tokenizer's own ``decode`` behind per-call argument conversions
that cost several times a short window's decode, so it is called directly (``text_decoder``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


def text_decoder(tokenizer: Any) -> Callable[[list[int]], str]:
    """``ids -> tokenizer.decode(ids, skip_special_tokens=True)``. A transformers fast tokenizer whose
    ``decode`` / ``_decode`` are transformers' own and that cleans up no spaces returns exactly its
    Rust tokenizer's ``decode(ids, skip_special_tokens=True)``: that one is called directly. Anything
    else (a slow tokenizer, an override, a stand-in with only ``decode``) goes through ``decode``."""

    def decode(ids: list[int]) -> str:
        return str(tokenizer.decode(ids, skip_special_tokens=True))

    if getattr(tokenizer, "_tokenizer", None) is None:
        return decode
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    if (
        isinstance(tokenizer, PreTrainedTokenizerFast)
        and isinstance(tokenizer._tokenizer, Tokenizer)
        and type(tokenizer).decode is PreTrainedTokenizerFast.decode
        and type(tokenizer)._decode is PreTrainedTokenizerFast._decode
        and not tokenizer.clean_up_tokenization_spaces
    ):
        return functools.partial(tokenizer._tokenizer.decode, skip_special_tokens=True)
    return decode


class StopChecker:
    """One output's text, token by token: ``push`` returns what may be released, ``flush`` the rest."""

    def __init__(self, tokenizer: Any, stop: tuple[str, ...] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.stopped = False
        self._decoder = text_decoder(tokenizer)
        # the decode window: ``_window[:_read]`` decodes to the end of the text so far (context for
        # the next tokens), ``_window[_read:]`` are the tokens whose text is not complete yet
        self._window: list[int] = []
        self._read = 0
        self._held = ""  # the end of the text so far that may begin a stop string (not released yet)

    def _decode(self, ids: list[int]) -> str:
        return self._decoder(ids) if ids else ""

    def _advance(self, final: bool = False) -> str:
        """The newly complete text of the window's unread tokens ('' while a multi-byte character is
        incomplete; ``final``: whatever is complete at the end)."""
        head = self._decode(self._window[: self._read])
        full = self._decode(self._window)
        if final:
            full = full.rstrip("\ufffd")
        elif full.endswith("\ufffd"):  # an incomplete multi-byte sequence: wait for the next token
            return ""
        if len(full) <= len(head):
            return ""
        self._window = self._window[self._read :]
        self._read = len(self._window)
        return full[len(head) :]

    def push(self, token_id: int) -> str:
        """Add one generated token; return the newly releasable text ('' if held back)."""
        self._window.append(token_id)
        new = self._advance()
        if not new:
            return ""
        if not self.stop:  # nothing is ever held back
            return new
        # A stop string that ends in the new text begins in it or in the held-back text: released text
        # is never the start of one (it would have been held back), so the search begins there.
        text = self._held + new
        for s in self.stop:
            i = text.find(s)
            if i != -1:
                self.stopped = True
                self._held = ""
                return text[:i]
        hold = 0
        for s in self.stop:  # keep back a suffix that may be the start of a stop string
            for n in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:n]):
                    hold = max(hold, n)
                    break
        self._held = text[len(text) - hold :]
        return text[: len(text) - hold]

    def flush(self) -> str:
        """Release held-back text at the end of generation (no stop string matched); the end of the
        stream."""
        if self.stopped:
            return ""
        out, self._held = self._held + self._advance(final=True), ""
        return out
