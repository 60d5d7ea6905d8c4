"""Tool calling inside the server: validated function definitions, tool choice, parsed calls.

The wire models (pydantic) are in ``hypic_agent/api/tool_schemas.py``; they turn into these.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

ChoiceMode = Literal["auto", "none", "required", "named"]
EMPTY_PARAMETERS: Mapping[str, Any] = MappingProxyType({"type": "object", "properties": {}})


@dataclass(frozen=True)
class Function:
    """One callable function: ``parameters`` is the JSON Schema of its arguments object."""

    name: str
    description: str | None = None
    parameters: Mapping[str, Any] = field(default_factory=lambda: EMPTY_PARAMETERS)
    strict: bool | None = None

    def openai(self) -> dict[str, Any]:
        """``{"type": "function", "function": {...}}``: what chat templates and prompts show."""
        fn: dict[str, Any] = {"name": self.name}
        if self.description:
            fn["description"] = self.description
        fn["parameters"] = _plain(self.parameters)
        return {"type": "function", "function": fn}

    def key(self) -> str:
        """JSON of the definition as rendered (cache key of its rendering; key order kept: it shows)."""
        return json.dumps(self.openai())


@dataclass(frozen=True)
class ToolChoice:
    mode: ChoiceMode = "auto"
    name: str | None = None  # mode "named": the function to call

    @property
    def forces_call(self) -> bool:
        return self.mode in ("required", "named")


@dataclass(frozen=True)
class ToolCall:
    """One call the model made: ``arguments`` is a JSON text (OpenAI's wire shape)."""

    name: str
    arguments: str
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def openai(self, index: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        if index is not None:
            out = {"index": index, **out}
        return out

    def arguments_object(self) -> Any:
        """The arguments parsed (a dict for a well-formed call; the raw text when it is not JSON)."""
        try:
            return json.loads(self.arguments)
        except ValueError:
            return self.arguments


@dataclass(frozen=True)
class ToolSetup:
    """What a chat request asked for: the catalogue, the choice, parallel calls."""

    functions: tuple[Function, ...] = ()
    choice: ToolChoice = field(default_factory=ToolChoice)
    parallel: bool = True

    @property
    def active(self) -> bool:
        """Calls are parsed out of the output (tools given and choice is not ``none``)."""
        return bool(self.functions) and self.choice.mode != "none"

    def named(self) -> Function:
        assert self.choice.name is not None
        return next(f for f in self.functions if f.name == self.choice.name)


def _plain(value: Any) -> Any:
    """Mapping proxies and tuples back to JSON-able dicts and lists."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
