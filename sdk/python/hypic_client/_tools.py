"""Tools and structured output on the wire: pydantic models or dicts -> OpenAI's request shapes.

``chat.completions.create(tools=[...], tool_choice=..., response_format=...)`` accepts OpenAI's
dicts as they are, and also:

* a pydantic model class as a tool (its name, docstring and JSON schema) or as the
  ``response_format`` (``json_schema``, strict);
* a function name as ``tool_choice`` (``"get_weather"`` forces that function), besides
  ``"auto"``, ``"none"``, ``"required"``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

CHOICES = ("auto", "none", "required")


def _schema_of(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema()


def tool_param(tool: Any) -> dict[str, Any]:
    """One ``tools`` entry: a dict as is, a pydantic model class as a function."""
    if isinstance(tool, type) and issubclass(tool, BaseModel):
        fn: dict[str, Any] = {"name": tool.__name__, "parameters": _schema_of(tool)}
        if tool.__doc__:
            fn["description"] = " ".join(tool.__doc__.split())
        return {"type": "function", "function": fn}
    if isinstance(tool, Mapping):
        return dict(tool)
    raise TypeError(f"a tool is an OpenAI tool dict or a pydantic model class, not {type(tool).__name__}")


def tools_param(tools: Sequence[Any] | None) -> list[dict[str, Any]] | None:
    return None if tools is None else [tool_param(t) for t in tools]


def tool_choice_param(choice: Any) -> Any:
    """``"auto"`` / ``"none"`` / ``"required"`` / a dict as is; any other string names the function."""
    if isinstance(choice, str) and choice not in CHOICES:
        return {"type": "function", "function": {"name": choice}}
    return choice


def response_format_param(fmt: Any) -> Any:
    """A pydantic model class -> ``{"type": "json_schema", ...}`` (strict); dicts as they are."""
    if isinstance(fmt, type) and issubclass(fmt, BaseModel):
        return {"type": "json_schema", "json_schema": {"name": fmt.__name__, "schema": _schema_of(fmt), "strict": True}}
    return fmt


def output_params(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with ``tools`` / ``tool_choice`` / ``response_format`` in their wire shapes."""
    out = dict(kwargs)
    if out.get("tools") is not None:
        out["tools"] = tools_param(out["tools"])
    if out.get("tool_choice") is not None:
        out["tool_choice"] = tool_choice_param(out["tool_choice"])
    if out.get("response_format") is not None:
        out["response_format"] = response_format_param(out["response_format"])
    return out
