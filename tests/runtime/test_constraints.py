"""GrammarConstraint / Grammars on the tiny byte-level tokenizer: masks, finish, special tokens, cache, errors."""

from __future__ import annotations

import json

import pytest

from hypic_agent.errors import InvalidRequestError
from hypic_agent.runtime.constraints import Grammars, GrammarSpec
from hypic_agent.runtime.models.tiny import TINY_BOS_ID, TINY_EOS_ID, TINY_VOCAB_SIZE
from hypic_agent.runtime.models.tokenizer import tiny_tokenizer


@pytest.fixture(scope="module")
def grammars():
    return Grammars(tiny_tokenizer(), TINY_VOCAB_SIZE, (TINY_EOS_ID,), max_entries=2)


def walk(constraint, text: str) -> None:
    for b in text.encode():
        mask = constraint.allowed(TINY_VOCAB_SIZE)
        assert mask.shape == (TINY_VOCAB_SIZE,) and bool(mask[b]), (text, chr(b))
        assert not constraint.is_finished()
        constraint.accept(b)


def test_json_object_mask_and_finish(grammars):
    c = grammars.factory(GrammarSpec("json_object"))()
    first = c.allowed(TINY_VOCAB_SIZE)
    assert int(first.sum()) == 1 and bool(first[ord("{")])  # compact JSON: an object, no leading space
    walk(c, '{"a": [1, true], "b": "x')
    inside = c.allowed(TINY_VOCAB_SIZE)
    assert not inside[TINY_BOS_ID] and not inside[TINY_EOS_ID]  # special tokens are never string content
    walk(c, '"}')
    assert c.is_finished()  # nothing but EOS could follow: done without spending a step on it


def test_schema_grammar_ends_where_the_schema_does(grammars):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    c = grammars.factory(GrammarSpec.json_schema(schema))()
    walk(c, '{"n": 12')
    assert not c.allowed(TINY_VOCAB_SIZE)[ord('"')]
    walk(c, "}")
    assert c.is_finished()
    wider = c.allowed(TINY_VOCAB_SIZE + 5)  # logits wider than the vocabulary: the rest stays masked
    assert wider.shape == (TINY_VOCAB_SIZE + 5,) and not wider[TINY_VOCAB_SIZE:].any()


def test_bare_number_may_end_or_go_on(grammars):
    c = grammars.factory(GrammarSpec.json_schema({"type": "integer"}))()
    walk(c, "7")
    mask = c.allowed(TINY_VOCAB_SIZE)
    assert mask[TINY_EOS_ID] and mask[ord("3")] and not c.is_finished()
    c.accept(TINY_EOS_ID)
    assert c.is_finished()


def test_compile_cache_and_eviction(grammars):
    spec = GrammarSpec.json_schema({"type": "object", "properties": {"k": {"enum": [1, 2]}}})
    grammars.compile(spec)
    hits = grammars.hits
    assert grammars.compile(GrammarSpec.json_schema(json.loads(spec.source))) is grammars.compile(spec)
    assert grammars.hits == hits + 2
    grammars.compile(GrammarSpec.json_schema({"type": "string"}))
    grammars.compile(GrammarSpec.json_schema({"type": "boolean"}))
    misses = grammars.misses
    grammars.compile(spec)  # evicted (max_entries=2): compiled again
    assert grammars.misses == misses + 1


def test_a_schema_xgrammar_rejects_is_a_400(grammars):
    with pytest.raises(InvalidRequestError) as e:
        grammars.compile(GrammarSpec.json_schema({"type": "nonsense"}, param="response_format.json_schema.schema"))
    assert e.value.param == "response_format.json_schema.schema" and "/project/" not in e.value.message


def test_accepting_a_masked_token_raises(grammars):
    c = grammars.factory(GrammarSpec("json_object"))()
    with pytest.raises(RuntimeError, match="not allowed"):
        c.accept(ord("x"))
