"""The official ``openai`` package and ``langchain-openai``'s ``ChatOpenAI`` against the server.

Both clients talk to the app through a ``TestClient`` (an ``httpx.Client`` on the ASGI app), so the
requests and responses go through their own parsing, as against a deployed server.
"""

from __future__ import annotations

import json
from functools import reduce
from operator import add

import jsonschema
import pytest
from pydantic import BaseModel, Field

openai = pytest.importorskip("openai")

MODEL = "tiny:qwen3_5_text"
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "pattern": "^[a-z]{1,8}$"},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Forecast", "parameters": WEATHER}}]
FORCED = {"type": "function", "function": {"name": "get_weather"}}
MSGS = [{"role": "user", "content": "Weather in Paris for three days?"}]
SCHEMA = {"type": "json_schema", "json_schema": {"name": "weather", "schema": WEATHER, "strict": True}}


@pytest.fixture
def oai(client):
    return openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=client, max_retries=0)


def test_forced_tool_call(oai):
    resp = oai.chat.completions.create(model=MODEL, messages=MSGS, tools=TOOLS, tool_choice=FORCED)
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)


def test_forced_tool_call_streamed(oai):
    whole = oai.chat.completions.create(model=MODEL, messages=MSGS, tools=TOOLS, tool_choice=FORCED)
    args: dict[int, str] = {}
    names: dict[int, str] = {}
    finish = None
    for chunk in oai.chat.completions.create(model=MODEL, messages=MSGS, tools=TOOLS, tool_choice=FORCED, stream=True):
        if not chunk.choices:
            continue
        for tc in chunk.choices[0].delta.tool_calls or []:
            names[tc.index] = names.get(tc.index, "") + (tc.function.name or "")
            args[tc.index] = args.get(tc.index, "") + (tc.function.arguments or "")
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and names == {0: "get_weather"}
    assert json.loads(args[0]) == json.loads(whole.choices[0].message.tool_calls[0].function.arguments)


def test_json_schema_response_format(oai):
    resp = oai.chat.completions.create(model=MODEL, messages=MSGS, response_format=SCHEMA, max_tokens=100)
    jsonschema.validate(json.loads(resp.choices[0].message.content), WEATHER)
    text = "".join(
        c.choices[0].delta.content or ""
        for c in oai.chat.completions.create(
            model=MODEL, messages=MSGS, response_format=SCHEMA, max_tokens=100, stream=True
        )
        if c.choices
    )
    assert text == resp.choices[0].message.content


def test_unknown_model_is_404_with_the_envelope(oai):
    with pytest.raises(openai.NotFoundError) as e:
        oai.chat.completions.create(model="gpt-4o-mini", messages=MSGS)
    assert e.value.status_code == 404
    assert e.value.body["type"] == "model_not_found" and MODEL in e.value.body["message"]
    assert oai.models.retrieve(MODEL).id == MODEL


def test_legacy_completions(oai):
    resp = oai.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=4, logprobs=2)
    assert resp.choices[0].finish_reason == "length" and len(resp.choices[0].logprobs.tokens) == 4


class Weather(BaseModel):
    """Forecast for a city (bounded fields: the tiny model's noise must still end)."""

    city: str = Field(pattern="^[a-z]{1,8}$")
    days: int = Field(ge=1, le=7)


def test_langchain_chat_openai(client):
    lc = pytest.importorskip("langchain_openai")
    llm = lc.ChatOpenAI(
        model=MODEL, base_url="http://testserver/v1", api_key="unused", http_client=client, max_retries=0
    )
    msg = llm.bind_tools([Weather], tool_choice="Weather").invoke("Weather in Paris?")
    assert [c["name"] for c in msg.tool_calls] == ["Weather"]
    Weather.model_validate(msg.tool_calls[0]["args"])
    for method in ("function_calling", "json_schema"):
        out = llm.with_structured_output(Weather, method=method).invoke("Weather in Paris?")
        assert isinstance(out, Weather) and 1 <= out.days <= 7


class City(BaseModel):
    """Unbounded fields (the issue's case): the grammar's bounds end them (a looping integer on the tiny model)."""

    name: str
    population: int
    country: str


@pytest.fixture
def bounded(make_client):
    # the tiny model also loops in strings: a short bound, in response_format and in forced tool calls
    return make_client(grammar_max_string_length=16, grammar_max_tool_string_length=16)


def test_parse_a_model_with_unbounded_fields(bounded):
    oai = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=bounded, max_retries=0)
    resp = oai.chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": "A city"}], response_format=City, max_tokens=200
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, City)
    assert list(json.loads(choice.message.content)) == ["name", "population", "country"]  # the schema's order
    assert len(choice.message.parsed.name) <= 16 and abs(choice.message.parsed.population) < 10**15


def test_langchain_structured_output_and_a_required_stream(bounded):
    lc = pytest.importorskip("langchain_openai")
    llm = lc.ChatOpenAI(
        model=MODEL,
        base_url="http://testserver/v1",
        api_key="unused",
        http_client=bounded,
        max_retries=0,
        max_tokens=200,
    )
    for method in ("function_calling", "json_schema"):
        out = llm.with_structured_output(City, method=method).invoke("A city")
        assert isinstance(out, City), method  # function_calling returned None when the call was cut off
    merged = reduce(add, llm.bind_tools([Weather], tool_choice="required").stream("Weather in Paris?"))
    calls = [(c["name"], json.dumps(c["args"])) for c in merged.tool_calls]
    assert calls and len(set(calls)) == len(calls) and merged.content == ""  # each call once, nothing leaked
    for c in merged.tool_calls:
        Weather.model_validate(c["args"])
