"""CallParser: calls out of model output, incrementally, in both syntaxes."""

from __future__ import annotations

import json

import pytest

from hypic_agent.tools.format import call_text
from hypic_agent.tools.parse import CallParser, parse_output
from hypic_agent.tools.spec import Function, ToolCall

FNS = [
    Function("get_time", None, {"type": "object", "properties": {"zone": {"type": "string"}}}),
    Function("add", None, {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "number"}}}),
]
TEXT = (
    "  Let me check.\n"
    '<tool_call>\n{"name": "get_time", "arguments": {"zone": "utc"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2.5}"}\n</tool_call>\n'
)


def test_whole_output():
    content, calls = parse_output(TEXT, "json", FNS)
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_time", {"zone": "utc"}),
        ("add", {"a": 1, "b": 2.5}),
    ]


@pytest.mark.parametrize("step", [1, 3, 7])
def test_streamed_in_small_pieces_gives_the_same(step):
    p = CallParser("json", FNS)
    pieces = [x for i in range(0, len(TEXT), step) for x in p.feed(TEXT[i : i + step])] + p.flush()
    content = "".join(x for x in pieces if isinstance(x, str))
    calls = [x for x in pieces if isinstance(x, ToolCall)]
    whole_content, whole_calls = parse_output(TEXT, "json", FNS)
    assert content == whole_content
    assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in whole_calls]


def test_partial_tag_is_held_back_until_clear():
    p = CallParser("json", FNS)
    assert p.feed("hello <tool_") == ["hello"]
    assert p.feed("box> x") == [" <tool_box> x"]


@pytest.mark.parametrize(
    "block",
    [
        '<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>',  # unknown function
        "<tool_call>\n{not json}\n</tool_call>",
        '<tool_call>\n{"arguments": {}}\n</tool_call>',  # no name
        '<tool_call>\n{"name": "get_time", "arguments": {"zone": "utc"}',  # never closed
    ],
)
def test_bad_blocks_stay_content(block):
    content, calls = parse_output(block, "json", FNS)
    assert calls == [] and content == block


def test_qwen_xml_values_follow_the_schema():
    text = call_text("add", {"a": 2, "b": 0.5}, "qwen_xml") + "\n" + call_text("get_time", {"zone": "42"}, "qwen_xml")
    assert "<function=add>\n<parameter=a>\n2\n</parameter>" in text
    content, calls = parse_output(text, "qwen_xml", FNS)
    assert content is None
    assert [json.loads(c.arguments) for c in calls] == [{"a": 2, "b": 0.5}, {"zone": "42"}]  # "42" stays a string


def test_call_text_round_trips_in_json_syntax():
    content, calls = parse_output(call_text("add", '{"a": 1}'), "json", FNS)
    assert content is None and json.loads(calls[0].arguments) == {"a": 1}
