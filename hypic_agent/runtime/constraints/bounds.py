"""Bounds that make JSON-schema grammars end: a schema rewritten before it is compiled.

A grammar only masks what is *invalid*; where a schema allows an unbounded value (a string, the
digits of an integer, the items of an array), a weak model can stay inside it until
``max_tokens`` (the tiny random model loops in digits at once: ``"population": 1111111...``).
``bound_schema(schema, bounds)`` returns a copy of the schema in which every such value has a
bound, in the schema's own terms, so xgrammar compiles it as it compiles any schema:

* a ``string`` with no ``maxLength``, ``pattern``, ``format``, ``enum`` or ``const`` gets
  ``maxLength`` (``max_string_length``). xgrammar writes a bounded string as one character class
  (no escapes: no ``"``, ``\\`` or line break inside); ``json_ebnf`` takes raw control characters
  out of that class so the output always parses as strict JSON;
* an ``integer`` / ``number`` with no lower (upper) bound gets ``minimum`` (``maximum``)
  ``-(10^d - 1)`` (``10^d - 1``) with ``d = max_number_digits``; xgrammar then writes at most
  ``d`` digits before the point, at most 6 after it and no exponent;
* an ``array`` with no ``maxItems`` gets ``maxItems`` (``max_array_items``).

Forced tool calls (``JsonBounds.for_tool_calls``) keep escapes: their strings are unbounded
unless the tool's schema bounds them or ``grammar_max_tool_string_length`` is set (a
``write_file(content)`` must be able to write lines and quotes), while their numbers and arrays
are bounded as above (a looping integer still ends).

A bound the schema sets itself is kept as it is. Key order is kept (xgrammar writes properties in
the order of ``properties``). A bound of 0 leaves that kind of value unbounded.

``json_object_schema(bounds)`` is ``response_format`` ``json_object`` in these terms: any JSON
object, its keys and string values bounded like strings, its numbers like numbers, its arrays'
items and its objects' keys at most ``max_array_items``. Values a schema leaves open (``{}``,
``additionalProperties: true``) are not rewritten: xgrammar writes them as unbounded JSON.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONE = (
    "items",
    "additionalProperties",
    "unevaluatedProperties",
    "additionalItems",
    "unevaluatedItems",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
)
# xgrammar 0.2.9 writes the characters of a string with maxLength / minLength as this class (it
# admits raw control characters, which strict JSON parsers reject); json_ebnf narrows it
_BOUNDED_CHARS = re.compile(r'^(\w+) ::= \(\(\[\^\\"\\\\\\r\\n\]\)\)$', re.MULTILINE)
_JSON_CHARS = r'\1 ::= (([^\\"\\\\\\0-\\x1f]))'


@dataclass(frozen=True)
class JsonBounds:
    max_string_length: int = 2048
    max_number_digits: int = 15
    max_array_items: int = 1024

    @classmethod
    def of(cls, settings: Any) -> JsonBounds:
        """The bounds of ``response_format`` schemas."""
        return cls(
            settings.grammar_max_string_length, settings.grammar_max_number_digits, settings.grammar_max_array_items
        )

    @classmethod
    def for_tool_calls(cls, settings: Any) -> JsonBounds:
        """The bounds of forced tool calls' arguments: strings unbounded (escapes kept) unless
        ``grammar_max_tool_string_length`` is set, numbers and arrays as ``of``."""
        return cls(
            settings.grammar_max_tool_string_length,
            settings.grammar_max_number_digits,
            settings.grammar_max_array_items,
        )


def bound_schema(schema: Any, bounds: JsonBounds | None) -> Any:
    """A copy of ``schema`` with every unbounded string, number and array bounded (module doc)."""
    if bounds is None or not isinstance(schema, Mapping):
        return schema
    out = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), Mapping):
            out[key] = {k: bound_schema(v, bounds) for k, v in out[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [bound_schema(v, bounds) for v in out[key]]
    for key in _SCHEMA_ONE:
        if isinstance(out.get(key), Mapping):
            out[key] = bound_schema(out[key], bounds)
        elif key == "items" and isinstance(out.get(key), list):  # draft-4 tuple items
            out[key] = [bound_schema(v, bounds) for v in out[key]]
    t = out.get("type")
    types = {t} if isinstance(t, str) else {x for x in t if isinstance(x, str)} if isinstance(t, list) else set()
    if "enum" in out or "const" in out:
        return out
    open_string = not any(k in out for k in ("maxLength", "pattern", "format"))
    if "string" in types and bounds.max_string_length > 0 and open_string:
        out["maxLength"] = max(bounds.max_string_length, _int(out.get("minLength")) or 0)
    if types & {"integer", "number"} and bounds.max_number_digits > 0:
        _bound_number(out, 10**bounds.max_number_digits - 1)
    if "array" in types and bounds.max_array_items > 0 and "maxItems" not in out:
        out["maxItems"] = max(bounds.max_array_items, _int(out.get("minItems")) or 0)
    return out


def json_object_schema(bounds: JsonBounds | None) -> dict[str, Any]:
    """Any JSON object, every value in it bounded (``response_format`` ``json_object``)."""
    if bounds is None:
        return {"type": "object"}
    value = {"$ref": "#/$defs/value"}
    obj: dict[str, Any] = {"type": "object", "additionalProperties": value}
    arr: dict[str, Any] = {"type": "array", "items": value}
    string: dict[str, Any] = {"type": "string"}
    if bounds.max_string_length > 0:
        obj["propertyNames"] = {"maxLength": bounds.max_string_length}
    if bounds.max_array_items > 0:
        obj["maxProperties"] = bounds.max_array_items
    kinds = [string, {"type": "number"}, {"type": "boolean"}, {"type": "null"}, arr, obj]
    return bound_schema({**obj, "$defs": {"value": {"anyOf": kinds}}}, bounds)


def _bound_number(out: dict[str, Any], span: int) -> None:
    """``minimum`` / ``maximum`` where the schema has neither bound on that side (``span`` = 10^d - 1)."""
    low = _num(out.get("minimum"), out.get("exclusiveMinimum"))
    high = _num(out.get("maximum"), out.get("exclusiveMaximum"))
    if low is None:
        out["minimum"] = min(-span, int(high) - span) if high is not None else -span
    if high is None:
        out["maximum"] = max(span, int(low) + span) if low is not None else span


def _num(*values: Any) -> float | None:
    for v in values:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return v
    return None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def json_ebnf(schema_json: str) -> str:
    """xgrammar's EBNF for a JSON schema (compact: ``", "`` and ``": "``, no other whitespace), with
    bounded strings' characters narrowed to what strict JSON allows unescaped."""
    import xgrammar as xgr

    ebnf = str(xgr.Grammar.from_json_schema(schema_json, any_whitespace=False))
    return _BOUNDED_CHARS.sub(_JSON_CHARS, ebnf)
