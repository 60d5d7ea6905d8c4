"""Grammars that force tool calls: xgrammar structural tags built from the functions' schemas.

``call_grammar(setup, syntax, bounds, max_calls)`` for ``tool_choice`` ``required`` (one call or,
with parallel calls, up to ``max_calls``, of any listed function) or a named function (exactly
one call of it). Each call is the tag the model writes (``format.py``) around its arguments,
constrained by the function's ``parameters`` schema, bounded by ``bounds`` (the API passes
``JsonBounds.for_tool_calls``: numbers and arrays bounded like a ``response_format`` schema's, so a
call cannot loop in the digits of an integer, and strings left unbounded unless the schema or
``grammar_max_tool_string_length`` bounds them, since xgrammar writes a bounded string without
escapes and arguments need them: a file's lines, a quote), in JSON or Qwen's XML parameters;
calls are separated by a newline. Nothing else may be written, so the output is calls only and
every call's arguments parse and validate.

Termination: after every complete call the grammar may end (the stop token is allowed), after
``max_calls`` it must. ``ForcedCalls`` (the per-request constraint) also ends decoding as soon as
the model writes a call it has already written in this answer, the way a weak model repeats
itself under a grammar that allows more calls; the repeat is not returned (``api/chat_output.py``).
"""

from __future__ import annotations

import json
from typing import Any

import torch

from hypic_agent.errors import InvalidRequestError
from hypic_agent.runtime.constraints import JsonBounds, bound_schema, json_ebnf
from hypic_agent.runtime.sampling import TokenConstraint
from hypic_agent.runtime.stopping import StopChecker
from hypic_agent.tools.format import CALL_CLOSE, CALL_OPEN, Syntax
from hypic_agent.tools.spec import Function, ToolSetup, _plain


def _call_tag(function: Function, syntax: Syntax, bounds: JsonBounds | None) -> dict[str, Any]:
    schema = bound_schema(_plain(function.parameters), bounds)
    if syntax == "json":
        return {
            "type": "tag",
            "begin": f'{CALL_OPEN}\n{{"name": "{function.name}", "arguments": ',
            "content": {"type": "grammar", "grammar": compact_json_ebnf(schema)},
            "end": f"}}\n{CALL_CLOSE}",
        }
    return {
        "type": "tag",
        "begin": f"{CALL_OPEN}\n<function={function.name}>\n",
        "content": {"type": "json_schema", "json_schema": schema, "style": "qwen_xml", "max_whitespace_cnt": 1},
        "end": f"\n</function>\n{CALL_CLOSE}",
    }


def compact_json_ebnf(schema: Any) -> str:
    """EBNF of JSON matching ``schema`` with no whitespace but ``", "`` and ``": "`` (what the
    ``json_schema`` structural-tag content cannot promise: it bounds whitespace, not forbids it)."""
    try:
        return json_ebnf(json.dumps(schema))
    except (RuntimeError, ValueError, TypeError) as e:
        raise InvalidRequestError(f"cannot build a grammar from a function's parameters: {e}", param="tools") from e


def call_grammar(
    setup: ToolSetup, syntax: Syntax, bounds: JsonBounds | None = None, max_calls: int = 1
) -> dict[str, Any]:
    """The structural tag (xgrammar JSON) for a forced or required tool choice: one call, or with
    ``parallel_tool_calls`` and ``tool_choice`` ``required`` 1 to ``max_calls`` calls."""
    assert setup.choice.forces_call, setup.choice
    if setup.choice.mode == "named":
        fmt: dict[str, Any] = _call_tag(setup.named(), syntax, bounds)
    else:
        tags = [_call_tag(f, syntax, bounds) for f in setup.functions]
        one: dict[str, Any] = tags[0] if len(tags) == 1 else {"type": "or", "elements": tags}
        fmt = one
        if setup.parallel and max_calls > 1:
            more = {"type": "sequence", "elements": [_const("\n"), one]}
            fmt = {
                "type": "sequence",
                "elements": [one, {"type": "repeat", "min": 0, "max": max_calls - 1, "content": more}],
            }
    return {"type": "structural_tag", "format": fmt}


class ForcedCalls:
    """The forced-call grammar's constraint, ended when a call repeats one written before it.

    Wraps the grammar's ``TokenConstraint``; follows the output text (``StopChecker``'s
    incremental decode) and compares each closed ``<tool_call>`` block with the earlier ones.
    """

    def __init__(self, inner: TokenConstraint, tokenizer: Any) -> None:
        self.inner = inner
        self._text = StopChecker(tokenizer)
        self._buf = ""
        self._seen: set[str] = set()
        self.repeated = False

    def allowed(self, vocab_size: int) -> torch.Tensor | None:
        return self.inner.allowed(vocab_size)

    def accept(self, token_id: int) -> None:
        self.inner.accept(token_id)
        self._buf += self._text.push(token_id)
        while (end := self._buf.find(CALL_CLOSE)) != -1:
            block = self._buf[: end + len(CALL_CLOSE)].strip()
            self._buf = self._buf[end + len(CALL_CLOSE) :]
            if block in self._seen:
                self.repeated = True
            self._seen.add(block)

    def is_finished(self) -> bool:
        return self.repeated or self.inner.is_finished()


def _const(value: str) -> dict[str, Any]:
    return {"type": "const_string", "value": value}
