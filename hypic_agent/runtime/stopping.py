"""Incremental detokenization with stop strings.

Decodes the generated ids each step (robust to multi-byte tokens), emits only text that can no
longer be part of a stop string, and cuts the output at the first stop string.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class StopChecker:
    tokenizer: Any
    stop: tuple[str, ...] = ()
    ids: list[int] = field(default_factory=list)
    emitted: int = 0  # chars of the decoded text already released
    stopped: bool = False

    def push(self, token_id: int) -> str:
        """Add one generated token; return the newly releasable text ('' if held back)."""
        self.ids.append(token_id)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # incomplete multi-byte sequence: wait for the next token
            return ""
        for s in self.stop:
            i = text.find(s)
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
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True).rstrip("\ufffd")
        out = text[self.emitted :]
        self.emitted = len(text)
        return out
