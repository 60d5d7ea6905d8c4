"""Wire value types shared by the request models: checked once, at the edge, by pydantic.

* ``Text``: a string that encodes as UTF-8 and holds no NUL (a lone UTF-16 surrogate such as
  ``"\\ud800"`` passes JSON parsing but breaks tokenizers and every JSON response; NUL cannot be
  stored in a PostgreSQL text column);
* ``Finite``: a float that is not NaN or +-Infinity (Python's JSON parser accepts both);
* ``JsonObject``: free-form JSON (segment ``metadata``) whose strings are ``Text`` and whose
  numbers are finite, walked without recursion however deep it nests;
* sampling ranges (``Temperature``, ``TopP``, ``TopK``, ``Seed``, ``Seam``, ``MaxTokens``), strict:
  a number must be a JSON number (``"4"``, ``true`` are type errors; an integer field also refuses
  ``4.0``), and ``Flag`` a JSON boolean (``"yes"``, ``1`` refused).

Violations raise ``PydanticCustomError`` of type ``INVALID_VALUE``; the API answers those with
400 ``invalid_request`` and the field as ``param`` (shape and type errors stay 422).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, Strict
from pydantic_core import PydanticCustomError

INVALID_VALUE = "invalid_value"
"""pydantic error type of a well-typed value out of its range (the API maps it to 400)."""

MIN_TEMPERATURE = 1e-3
"""Smallest non-zero temperature: below it ``logits / t`` overflows float32 (inf/nan probabilities)."""
MAX_TEMPERATURE = 5.0
SEED_LIMIT = 1 << 64
INT32_MAX = (1 << 31) - 1


def invalid(message: str, **ctx: Any) -> PydanticCustomError:
    return PydanticCustomError(INVALID_VALUE, message, ctx or None)


def check_text(value: str) -> str:
    if "\x00" in value:
        raise invalid("contains a NUL character (\\u0000) at index {index}", index=value.index("\x00"))
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise invalid(
            "holds a lone UTF-16 surrogate ({char}) at index {index}; send valid Unicode text",
            char=f"\\u{ord(value[exc.start]):04x}",
            index=exc.start,
        ) from None
    return value


def check_finite(value: float) -> float:
    if not math.isfinite(value):
        raise invalid("must be a finite number, not {value}", value=str(value))
    return value


def check_json(value: Any) -> Any:
    """Every string (keys too) is ``Text`` and every number finite; iterative, any depth."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for k, v in item.items():
                check_text(str(k))
                stack.append(v)
        elif isinstance(item, list | tuple):
            stack.extend(item)
        elif isinstance(item, str):
            check_text(item)
        elif isinstance(item, float):
            check_finite(item)
    return value


def json_depth(value: Any) -> int:
    """Nesting depth: 0 for a scalar, 1 for ``{}`` or ``[]`` of scalars (iterative)."""
    deepest = 0
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
            deepest = max(deepest, depth + 1)
        elif isinstance(item, list | tuple):
            stack.extend((v, depth + 1) for v in item)
            deepest = max(deepest, depth + 1)
    return deepest


def check_temperature(value: float) -> float:
    check_finite(value)
    if value != 0.0 and not MIN_TEMPERATURE <= value <= MAX_TEMPERATURE:
        low, high = MIN_TEMPERATURE, MAX_TEMPERATURE
        raise invalid("must be 0 (greedy) or in [{low}, {high}], not {value}", low=low, high=high, value=value)
    return value


def check_top_p(value: float) -> float:
    check_finite(value)
    if not 0.0 < value <= 1.0:
        raise invalid("must be in (0, 1], not {value}", value=value)
    return value


def check_seam(value: float | str) -> float | str:
    if value in ("auto", "blend"):  # chosen per request under the server's seam_budget
        return value
    assert not isinstance(value, str)
    check_finite(value)
    if value < 0:
        raise invalid("must be >= 0 (0 = none, (0,1] = fraction, > 1 = tokens), not {value}", value=value)
    if value > 1 and value != int(value):
        raise invalid("above 1 is a token count and must be a whole number, not {value}", value=value)
    if value > INT32_MAX:
        raise invalid("must be at most {limit} tokens", limit=INT32_MAX)
    return value


def _in_range(low: int, high: int, what: str) -> Any:
    def check(value: int) -> int:
        if not low <= value <= high:
            raise invalid("must be {what} in [{low}, {high}], not {value}", what=what, low=low, high=high, value=value)
        return value

    return check


Text = Annotated[str, AfterValidator(check_text), Field(json_schema_extra={"pattern": "^[^\\u0000]*$"})]
Finite = Annotated[float, AfterValidator(check_finite)]
JsonObject = Annotated[dict[str, Any], AfterValidator(check_json)]
Flag = Annotated[bool, Strict()]
"""A JSON ``true`` / ``false`` only."""
Temperature = Annotated[
    float,
    Strict(),
    AfterValidator(check_temperature),
    Field(json_schema_extra={"anyOf": [{"const": 0}, {"minimum": MIN_TEMPERATURE, "maximum": MAX_TEMPERATURE}]}),
]
TopP = Annotated[
    float, Strict(), AfterValidator(check_top_p), Field(json_schema_extra={"exclusiveMinimum": 0, "maximum": 1})
]
TopK = Annotated[
    int,
    Strict(),
    AfterValidator(_in_range(0, INT32_MAX, "an integer")),
    Field(json_schema_extra={"minimum": 0, "maximum": INT32_MAX}),
]
Seed = Annotated[
    int,
    Strict(),
    AfterValidator(_in_range(0, SEED_LIMIT - 1, "an unsigned 64-bit integer")),
    Field(json_schema_extra={"minimum": 0, "maximum": SEED_LIMIT - 1}),
]
_TOKEN_SEAM = {"type": "integer", "minimum": 1, "maximum": INT32_MAX}
Seam = Annotated[
    Annotated[float, Strict()] | Literal["auto", "blend"],
    AfterValidator(check_seam),
    Field(json_schema_extra={"anyOf": [{"minimum": 0, "maximum": 1}, _TOKEN_SEAM, {"enum": ["auto", "blend"]}]}),
]
MaxTokens = Annotated[
    int,
    Strict(),
    AfterValidator(_in_range(1, INT32_MAX, "a token count")),
    Field(json_schema_extra={"minimum": 1, "maximum": INT32_MAX}),
]
