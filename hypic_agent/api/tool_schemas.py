"""Wire models of OpenAI's tool calling and structured output, and what they turn into inside.

``tools`` / ``tool_choice`` / ``parallel_tool_calls`` -> ``ToolSetup`` (``tool_setup``);
``response_format`` -> a ``GrammarSpec`` or None (``response_spec``). Shapes are checked here
(422); what only makes sense across fields (a named function that is not in ``tools``, a forced
call with no tools, a forced call together with a JSON ``response_format``) is a 400 with the field.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from hypic_agent.errors import InvalidRequestError
from hypic_agent.runtime.constraints.bounds import JsonBounds
from hypic_agent.runtime.constraints.compiler import GrammarSpec
from hypic_agent.tools.spec import EMPTY_PARAMETERS, Function, ToolChoice, ToolSetup
from hypic_agent.wire import JsonObject, Text, check_json

_NAME = r"^[A-Za-z0-9_.\-]{1,64}$"


class FunctionIn(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = Field(pattern=_NAME, description="a-z, A-Z, 0-9, _ . - (64 at most)")
    description: Text | None = None
    parameters: JsonObject | None = Field(default=None, description="JSON Schema of the arguments object")
    strict: bool | None = None


class ToolIn(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["function"] = "function"
    function: FunctionIn


class NamedFunctionIn(BaseModel):
    name: Text


class NamedToolChoiceIn(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["function"] = "function"
    function: NamedFunctionIn


class JsonSchemaIn(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    name: Text = "response"
    description: Text | None = None
    schema_: JsonObject = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormatIn(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["text", "json_object", "json_schema"] = "text"
    json_schema: JsonSchemaIn | None = None


class CalledFunctionIn(BaseModel):
    name: Text
    arguments: Text = "{}"

    @field_validator("arguments")
    @classmethod
    def _json_object(cls, v: str) -> str:
        try:
            parsed = json.loads(v or "{}")
        except (ValueError, RecursionError) as e:
            raise ValueError(f"tool call arguments must be a JSON text ({e})") from e
        check_json(parsed)  # its strings go into the prompt: no lone surrogates, no NaN
        return v or "{}"


class ToolCallIn(BaseModel):
    """An assistant's earlier call, in the history (``messages[i].tool_calls``)."""

    model_config = ConfigDict(extra="allow")

    id: Text | None = None
    type: Literal["function"] = "function"
    function: CalledFunctionIn


ToolChoiceIn = Literal["auto", "none", "required"] | NamedToolChoiceIn


def tool_setup(tools: list[ToolIn] | None, choice: ToolChoiceIn | None, parallel: bool | None) -> ToolSetup:
    functions = tuple(
        Function(t.function.name, t.function.description, t.function.parameters or EMPTY_PARAMETERS, t.function.strict)
        for t in tools or []
    )
    names = [f.name for f in functions]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise InvalidRequestError(f"function names must be unique in tools; repeated: {dup}", param="tools")
    if isinstance(choice, NamedToolChoiceIn):
        if choice.function.name not in names:
            raise InvalidRequestError(
                f"tool_choice names {choice.function.name!r}, which is not in tools ({names or 'none given'})",
                param="tool_choice",
            )
        mode = ToolChoice("named", choice.function.name)
    else:
        mode = ToolChoice(choice or "auto")
        if mode.mode == "required" and not functions:
            raise InvalidRequestError("tool_choice 'required' needs tools", param="tool_choice")
    return ToolSetup(functions, mode, True if parallel is None else parallel)


def response_spec(fmt: ResponseFormatIn | None, bounds: JsonBounds | None = None) -> GrammarSpec | None:
    """The grammar of ``response_format`` (``bounds``: the schema's unbounded values bounded)."""
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return GrammarSpec.json_object(param="response_format", bounds=bounds)
    if fmt.json_schema is None:
        raise InvalidRequestError(
            "response_format of type json_schema needs json_schema: {name, schema}", param="response_format.json_schema"
        )
    return GrammarSpec.json_schema(fmt.json_schema.schema_, param="response_format.json_schema.schema", bounds=bounds)
