"""A model's output -> text and tool calls, incrementally (the same code for streams and whole bodies).

``CallParser.feed(text)`` takes output text as it is generated and returns what can be released:
``str`` pieces of content and ``ToolCall`` objects, each call as soon as its closing tag arrived.
Text that may be the start of ``<tool_call>`` is held back until it is clear; a call block is
held whole. A block that does not parse (bad JSON, an unknown function, no name) is released as
content, as is an unclosed block at the end (``flush``). Content is trimmed: leading whitespace,
trailing whitespace and whitespace between calls are not released.

Syntaxes (``format.py``): ``json`` (``{"name": ..., "arguments": {...}}`` inside the tags) and
``qwen_xml`` (``<function=NAME>`` with ``<parameter=KEY>VALUE</parameter>`` inside the tags; a
value is JSON-decoded unless the parameter's schema says ``string``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from hypic_agent.tools.format import CALL_CLOSE, CALL_OPEN, Syntax
from hypic_agent.tools.spec import Function, ToolCall

_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*?)</function>\s*", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)

Piece = str | ToolCall


class CallParser:
    def __init__(self, syntax: Syntax, functions: Sequence[Function]) -> None:
        self.syntax = syntax
        self.functions: Mapping[str, Function] = {f.name: f for f in functions}
        self._buf = ""
        self._inside = False
        self._pending_ws = ""
        self._released = False  # any content released yet (leading whitespace is dropped)

    def feed(self, text: str) -> list[Piece]:
        self._buf += text
        out: list[Piece] = []
        while True:
            if not self._inside:
                i = self._buf.find(CALL_OPEN)
                if i == -1:
                    keep = _partial_suffix(self._buf, CALL_OPEN)
                    self._text(self._buf[: len(self._buf) - keep], out)
                    self._buf = self._buf[len(self._buf) - keep :]
                    return out
                self._text(self._buf[:i], out)
                self._buf, self._inside = self._buf[i:], True
            j = self._buf.find(CALL_CLOSE)
            if j == -1:
                return out
            block, self._buf = self._buf[: j + len(CALL_CLOSE)], self._buf[j + len(CALL_CLOSE) :]
            self._inside = False
            call = self.parse_block(block)
            if call is None:
                self._text(block, out)
            else:
                self._pending_ws = ""
                out.append(call)

    def flush(self) -> list[Piece]:
        out: list[Piece] = []
        self._text(self._buf, out)
        self._buf, self._inside, self._pending_ws = "", False, ""
        return out

    def _text(self, piece: str, out: list[Piece]) -> None:
        text = self._pending_ws + piece
        if not text.strip():
            self._pending_ws = text if self._released else ""
            return
        if not self._released:
            text = text.lstrip()
        body = text.rstrip()
        self._pending_ws = text[len(body) :]
        self._released = True
        out.append(body)

    def parse_block(self, block: str) -> ToolCall | None:
        body = block[len(CALL_OPEN) : -len(CALL_CLOSE)]
        name, args = self._json_call(body) if self.syntax == "json" else self._xml_call(body)
        if name is None or name not in self.functions:
            return None
        return ToolCall(name=name, arguments=json.dumps(args, ensure_ascii=False))

    @staticmethod
    def _json_call(body: str) -> tuple[str | None, Any]:
        try:
            obj = json.loads(body, strict=False)  # raw control characters in strings: tolerated
        except ValueError:
            return None, None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None, None
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args, strict=False)
            except ValueError:
                return None, None
        return (obj["name"], args) if isinstance(args, dict) else (None, None)

    def _xml_call(self, body: str) -> tuple[str | None, Any]:
        m = _FUNCTION.fullmatch(body)
        if m is None:
            return None, None
        name = m.group(1).strip()
        props = (self.functions[name].parameters.get("properties") or {}) if name in self.functions else {}
        args: dict[str, Any] = {}
        for key, raw in _PARAMETER.findall(m.group(2)):
            schema = props.get(key.strip()) or {}
            args[key.strip()] = raw if schema.get("type") == "string" else _json_or_text(raw.strip())
        return name, args


def parse_output(text: str, syntax: Syntax, functions: Sequence[Function]) -> tuple[str | None, list[ToolCall]]:
    """A whole output -> ``(content or None, calls)``."""
    parser = CallParser(syntax, functions)
    pieces = [*parser.feed(text), *parser.flush()]
    content = "".join(p for p in pieces if isinstance(p, str))
    return content or None, [p for p in pieces if isinstance(p, ToolCall)]


def _json_or_text(raw: str) -> Any:
    try:
        return json.loads(raw, strict=False)
    except ValueError:
        return raw


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
