"""Incremental detokenization with stop strings.

Each generated token decodes only a short window of ids (the tokens since the last released text
plus the chunk before it, for context such as a leading space), not the whole output: a step of a
batch of long answers stays O(1) per request instead of O(length). Text is released only when it
is complete (no dangling multi-byte sequence) and can no longer be the start of a stop string; the
output is cut at the first stop string.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class StopChecker:
    tokenizer: Any
    stop: tuple[str, ...] = ()
    ids: list[int] = field(default_factory=list)
    text: str = ""  # the complete text decoded so far
    emitted: int = 0  # chars of ``text`` already released
    stopped: bool = False
    _prefix: int = 0  # ids[_prefix:_read] decode to the end of ``text`` (the context window)
    _read: int = 0  # ids before this are in ``text``

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True) if ids else ""

    def _advance(self, final: bool = False) -> int:
        """Append the newly complete text of ``ids[_read:]``; returns the length ``text`` had before."""
        before = len(self.text)
        head = self._decode(self.ids[self._prefix : self._read])
        full = self._decode(self.ids[self._prefix :])
        if final:
            full = full.rstrip("\ufffd")
        elif full.endswith("\ufffd"):  # an incomplete multi-byte sequence: wait for the next token
            return before
        if len(full) > len(head):
            self.text += full[len(head) :]
            self._prefix, self._read = self._read, len(self.ids)
        return before

    def push(self, token_id: int) -> str:
        """Add one generated token; return the newly releasable text ('' if held back)."""
        self.ids.append(token_id)
        before = self._advance()
        text = self.text
        if len(text) == before:
            return ""
        longest = max((len(s) for s in self.stop), default=0)
        start = max(0, before - longest + 1)  # a new stop string must overlap the new text
        for s in self.stop:
            i = text.find(s, start)
            if i != -1:
                self.stopped = True
                out = text[self.emitted : i] if i > self.emitted else ""
                self.emitted = max(self.emitted, i)
                return out
        hold = 0
        for s in self.stop:  # keep back a suffix that may be the start of a stop string
            for n in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:n]):
                    hold = max(hold, n)
                    break
        release_to = len(text) - hold
        out = text[self.emitted : release_to] if release_to > self.emitted else ""
        self.emitted = max(self.emitted, release_to)
        return out

    def flush(self) -> str:
        """Release held-back text at the end of generation (no stop string matched)."""
        if self.stopped:
            return ""
        self._advance(final=True)
        out = self.text[self.emitted :]
        self.emitted = len(self.text)
        return out
