"""A tool catalogue as segments: one per function, so each is cached once and reused in any order.

``with_tools(segments, functions, framer, fmt)`` takes a request's segments (its leading
``system`` segments first, as ``chat_to_segments`` builds them) and returns them with the
catalogue in place:

* default format (``format.py``): the system segments, a ``system`` segment with the
  instructions, then one ``text`` segment per function (``Tool NAME\\n{json}\\n\\n``);
* the template's format: the template renders the system message and the tool list as one block
  (Qwen: ``<|im_start|>system\\n{system}\\n\\n# Tools ... <tools>\\n{tool}\\n{tool}\\n</tools>
  ...<|im_end|>``). That block is cut into a head (the system message and the tools preamble),
  one piece per function and a tail, found by rendering each function alone and twice (the
  second copy is exactly what one function adds). The pieces are checked: head + pieces + tail
  must equal the template's own render of the whole list, in the request's order; where a
  template does not render tools that way, the whole block is one segment (cached, but only
  reused with the same tools in the same order).

All of these are plain segments: keyed by their tokens, stored like documents.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from functools import lru_cache
from typing import ClassVar

from hypic_agent.segments.prompt.framing import Framer
from hypic_agent.segments.prompt.kinds import Segment
from hypic_agent.tools.format import DEFAULT_INSTRUCTIONS, ToolFormat, tool_block
from hypic_agent.tools.spec import Function

log = logging.getLogger("hypic.tools")
_PROBE = {"role": "user", "content": "hypic-probe"}


def with_tools(segments: Sequence[Segment], functions: Sequence[Function], framer: Framer, fmt: ToolFormat) -> list:
    """``segments`` with the catalogue of ``functions`` after (or around) the leading system segments."""
    if not functions:
        return list(segments)
    n_sys = 0
    while n_sys < len(segments) and segments[n_sys].kind == "system" and segments[n_sys].text is not None:
        n_sys += 1
    head, rest = list(segments[:n_sys]), list(segments[n_sys:])
    if fmt.template_tools:
        system = "\n\n".join(s.text or "" for s in head) or None
        pieces = TemplateCatalogue.of(framer).pieces(system, tuple(f.key() for f in functions))
        if pieces is not None:
            names = [None, *(f.name for f in functions), None]
            if len(pieces) != len(names):  # one block: the template could not be cut per tool
                names = [None]
            return [*(_verbatim(p, n) for p, n in zip(pieces, names, strict=True) if p), *rest]
    catalogue = [Segment(kind="system", text=DEFAULT_INSTRUCTIONS, title="tools")]
    catalogue += [_verbatim(tool_block(f), f.name) for f in functions]
    return [*head, *catalogue, *rest]


def _verbatim(text: str, title: str | None) -> Segment:
    return Segment(kind="text", text=text, title=title, metadata={"tool": title} if title else {})


class TemplateCatalogue:
    """Renders tools with one framer's chat template (per-framer, memoized)."""

    _by_framer: ClassVar[dict[int, tuple[Framer, TemplateCatalogue]]] = {}

    def __init__(self, framer: Framer) -> None:
        self.framer = framer
        self._piece = lru_cache(maxsize=1024)(self._piece_uncached)
        self._block = lru_cache(maxsize=256)(self._block_uncached)

    @classmethod
    def of(cls, framer: Framer) -> TemplateCatalogue:
        hit = cls._by_framer.get(id(framer))
        if hit is None or hit[0] is not framer:
            hit = (framer, cls(framer))
            cls._by_framer[id(framer)] = hit
        return hit[1]

    def pieces(self, system: str | None, keys: tuple[str, ...]) -> list[str] | None:
        """``[head, piece per tool..., tail]``, or ``[block]`` when it cannot be cut; None: no render."""
        whole = self._block(system, keys)
        if whole is None:
            return None
        cut = [c for c in (self._piece(system, k) for k in keys) if c is not None]
        if len(cut) == len(keys):
            head, tail = cut[0][0], cut[0][2]
            same = all(c[0] == head and c[2] == tail for c in cut)
            if same and head + "".join(c[1] for c in cut) + tail == whole:
                return [head, *(c[1] for c in cut), tail]
        log.info("chat template's tools block does not cut per tool; the catalogue is one segment")
        return [whole]

    def _block_uncached(self, system: str | None, keys: tuple[str, ...]) -> str | None:
        msgs = [{"role": "system", "content": system}] if system else []
        try:
            full = self.framer.render_conversation([*msgs, _PROBE], tools=[json.loads(k) for k in keys])
            probe = self.framer.frame_messages([_PROBE])
        except Exception as e:  # a template that cannot render this: the default format serves
            log.warning("chat template cannot render tools (%s); using the default tool format", e)
            return None
        return full[: -len(probe)] if probe and full.endswith(probe) else None

    def _piece_uncached(self, system: str | None, key: str) -> tuple[str, str, str] | None:
        """``(head, piece, tail)`` of one tool: render it once and twice, the second copy is the piece."""
        once, twice = self._block(system, (key,)), self._block(system, (key, key))
        if once is None or twice is None or len(twice) <= len(once):
            return None
        p = _common_prefix(once, twice)
        d = len(twice) - len(once)
        piece = twice[p : p + d]
        if twice[p + d :] != once[p:] or p < d or once[p - d : p] != piece:
            return None
        return once[: p - d], piece, once[p:]


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
