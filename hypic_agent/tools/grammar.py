"""Grammars that force tool calls: xgrammar structural tags built from the functions' schemas.

``call_grammar(setup, syntax)`` for ``tool_choice`` ``required`` (one call or, with parallel
calls, several, of any listed function) or a named function (exactly one call of it). Each call
is the tag the model writes (``format.py``) around its arguments, constrained by the function's
``parameters`` schema (JSON, or Qwen's XML parameters); calls are separated by a newline. Nothing
else may be written, so the output is calls only and every call's arguments parse and validate.
"""

from __future__ import annotations

import json
from typing import Any

from hypic_agent.errors import InvalidRequestError
from hypic_agent.tools.format import CALL_CLOSE, CALL_OPEN, Syntax
from hypic_agent.tools.spec import Function, ToolSetup, _plain


def _call_tag(function: Function, syntax: Syntax) -> dict[str, Any]:
    schema = _plain(function.parameters)
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
    import xgrammar as xgr

    try:
        return str(xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False))
    except (RuntimeError, ValueError, TypeError) as e:
        raise InvalidRequestError(f"cannot build a grammar from a function's parameters: {e}", param="tools") from e


def call_grammar(setup: ToolSetup, syntax: Syntax) -> dict[str, Any]:
    """The structural tag (xgrammar JSON) for a forced or required tool choice."""
    assert setup.choice.forces_call, setup.choice
    if setup.choice.mode == "named":
        fmt: dict[str, Any] = _call_tag(setup.named(), syntax)
    else:
        tags = [_call_tag(f, syntax) for f in setup.functions]
        one: dict[str, Any] = tags[0] if len(tags) == 1 else {"type": "or", "elements": tags}
        fmt = one
        if setup.parallel:
            more = {"type": "star", "content": {"type": "sequence", "elements": [_const("\n"), one]}}
            fmt = {"type": "sequence", "elements": [one, more]}
    return {"type": "structural_tag", "format": fmt}


def _const(value: str) -> dict[str, Any]:
    return {"type": "const_string", "value": value}
