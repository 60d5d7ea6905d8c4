"""Forced-call grammars (``tools/grammar.py``) on the tiny byte-level tokenizer: how many calls they
allow, that each may end the answer, bounded arguments, and ``ForcedCalls`` ending on a repeat."""

from __future__ import annotations

import pytest

from hypic_agent.runtime.constraints import Grammars, GrammarSpec, JsonBounds
from hypic_agent.runtime.models.loading.tokenizer import tiny_tokenizer
from hypic_agent.runtime.models.testing.tiny import TINY_EOS_ID, TINY_VOCAB_SIZE
from hypic_agent.tools.format import call_text
from hypic_agent.tools.grammar import ForcedCalls, call_grammar
from hypic_agent.tools.spec import Function, ToolChoice, ToolSetup

CITY = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}
FNS = (Function("get_weather", None, CITY), Function("get_time", None, {"type": "object", "properties": {}}))
BOUNDS = JsonBounds(max_string_length=4, max_number_digits=2, max_array_items=4)


@pytest.fixture(scope="module")
def grammars():
    return Grammars(tiny_tokenizer(), TINY_VOCAB_SIZE, (TINY_EOS_ID,))


def constraint(grammars, setup, max_calls, repeat_stop=False):
    tag = call_grammar(setup, "json", BOUNDS, max_calls)
    inner = grammars.factory(GrammarSpec.structural_tag(tag))()
    return ForcedCalls(inner, tiny_tokenizer()) if repeat_stop else inner


def write(c, text):
    for b in text.encode():
        assert c.allowed(TINY_VOCAB_SIZE)[b], (text, chr(b))
        assert not c.is_finished()
        c.accept(b)


A = call_text("get_weather", {"city": "rome", "days": 3})
B = call_text("get_time", {})


def test_required_parallel_allows_up_to_max_calls_and_may_end_after_each(grammars):
    c = constraint(grammars, ToolSetup(FNS, ToolChoice("required"), parallel=True), max_calls=3)
    write(c, A)
    mask = c.allowed(TINY_VOCAB_SIZE)
    assert mask[TINY_EOS_ID] and mask[ord("\n")] and not c.is_finished()  # the end is allowed, or another call
    write(c, "\n" + B + "\n" + A)
    assert c.is_finished()  # the third call was the last one allowed


@pytest.mark.parametrize(
    ("choice", "parallel"), [(ToolChoice("named", "get_weather"), True), (ToolChoice("required"), False)]
)
def test_one_call_when_named_or_not_parallel(grammars, choice, parallel):
    c = constraint(grammars, ToolSetup(FNS, choice, parallel=parallel), max_calls=8)
    write(c, A)
    assert c.is_finished()


def test_call_arguments_are_bounded(grammars):
    c = constraint(grammars, ToolSetup(FNS, ToolChoice("named", "get_weather")), max_calls=1)
    write(c, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "abcd')
    mask = c.allowed(TINY_VOCAB_SIZE)
    assert int(mask.sum()) == 1 and mask[ord('"')]  # 4 characters: the string must close
    write(c, '", "days": 99')
    assert not c.allowed(TINY_VOCAB_SIZE)[ord("9")]  # 2 digits


def test_a_repeated_call_ends_decoding(grammars):
    setup = ToolSetup(FNS, ToolChoice("required"), parallel=True)
    c = constraint(grammars, setup, max_calls=8, repeat_stop=True)
    write(c, A + "\n" + B + "\n")
    assert not c.is_finished()  # two different calls: the model may go on
    write(c, A[:-1])
    c.accept(A.encode()[-1])
    assert c.is_finished() and c.repeated  # the first call again: done


def test_qwen_xml_calls_are_bounded_and_may_end_after_each(grammars):
    tag = call_grammar(ToolSetup(FNS, ToolChoice("required"), parallel=True), "qwen_xml", BOUNDS, 2)
    c = grammars.factory(GrammarSpec.structural_tag(tag))()
    write(c, "<tool_call>\n<function=get_weather>\n<parameter=city>\nabcd")
    assert not c.allowed(TINY_VOCAB_SIZE)[ord("e")]  # the string bound holds in Qwen's XML parameters too
    write(c, "\n</parameter>\n</function>\n</tool_call>")
    assert c.allowed(TINY_VOCAB_SIZE)[TINY_EOS_ID] and not c.is_finished()
    write(c, "\n" + call_text("get_weather", {"city": "ab", "days": 12}, "qwen_xml"))
    assert c.is_finished()  # max_calls=2


WRITE = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "content": {"type": "string"}, "mode": {"type": "integer"}},
    "required": ["path", "content", "mode"],
}
TEXT = 'line one\nshe said "hi" \\ done\n'


@pytest.mark.parametrize("syntax", ["json", "qwen_xml"])
def test_default_tool_bounds_keep_escapes_and_bound_numbers(grammars, syntax):
    """A free-text argument (``write_file(content)``) can hold line breaks, quotes and backslashes
    under the default settings; an integer is still bounded (the looping-digits case ends)."""
    from hypic_agent.config import Settings

    bounds = JsonBounds.for_tool_calls(Settings())
    assert bounds.max_string_length == 0 and bounds.max_number_digits == 15
    setup = ToolSetup((Function("write_file", None, WRITE),), ToolChoice("named", "write_file"))
    tag = call_grammar(setup, syntax, bounds, 1)

    def fresh():
        return grammars.factory(GrammarSpec.structural_tag(tag))()

    c = fresh()
    write(c, call_text("write_file", {"path": "a.txt", "content": TEXT + "x" * 3000, "mode": 420}, syntax))
    assert c.is_finished()  # the whole call was accepted (one named call: then the end)
    if syntax == "json":
        c = fresh()
        write(c, '<tool_call>\n{"name": "write_file", "arguments": {"path": "a.txt", "content": "a')
        assert not c.allowed(TINY_VOCAB_SIZE)[ord("\n")]  # a raw line break: not strict JSON
        write(c, '", "mode": ' + "9" * 15)
        mask = c.allowed(TINY_VOCAB_SIZE)
        assert not mask[ord("9")] and not mask[ord("0")] and mask[ord("}")]  # 15 digits at most
    else:
        c = fresh()
        write(c, "<tool_call>\n<function=write_file>\n<parameter=path>\na\n</parameter>\n<parameter=content>\n")
        write(c, TEXT)
        write(c, "\n</parameter>\n<parameter=mode>\n" + "9" * 15)
        assert not c.allowed(TINY_VOCAB_SIZE)[ord("9")]


def test_a_response_format_string_keeps_its_bound(grammars):
    """``response_format`` schemas keep the string bound (``JsonBounds.of``): the string ends."""
    from hypic_agent.config import Settings

    bounds = JsonBounds.of(Settings(grammar_max_string_length=4))
    schema = {"type": "object", "properties": {"content": {"type": "string"}}, "required": ["content"]}
    c = grammars.factory(GrammarSpec.json_schema(schema, bounds=bounds))()
    write(c, '{"content": "abcd')
    mask = c.allowed(TINY_VOCAB_SIZE)
    assert int(mask.sum()) == 1 and mask[ord('"')]
