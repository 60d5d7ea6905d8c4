"""Forced-call grammars (``tools/grammar.py``) on the tiny byte-level tokenizer: how many calls they
allow, that each may end the answer, bounded arguments, and ``ForcedCalls`` ending on a repeat."""

from __future__ import annotations

import pytest

from hypic_agent.runtime.constraints import Grammars, GrammarSpec, JsonBounds
from hypic_agent.runtime.models.tiny import TINY_EOS_ID, TINY_VOCAB_SIZE
from hypic_agent.runtime.models.tokenizer import tiny_tokenizer
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
