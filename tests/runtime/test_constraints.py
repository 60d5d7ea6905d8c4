"""GrammarConstraint / Grammars on the tiny byte-level tokenizer: masks, finish, special tokens, cache, errors,
and the bounds (``bounds.py``) that make schema grammars end, with the schema's key order."""

from __future__ import annotations

import json

import pytest

from hypic_agent.errors import InvalidRequestError
from hypic_agent.runtime.constraints import Grammars, GrammarSpec, JsonBounds, bound_schema
from hypic_agent.runtime.models.loading.tokenizer import tiny_tokenizer
from hypic_agent.runtime.models.testing.tiny import TINY_BOS_ID, TINY_EOS_ID, TINY_VOCAB_SIZE


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


SMALL = JsonBounds(max_string_length=5, max_number_digits=3, max_array_items=2)


def test_bound_schema_bounds_only_what_the_schema_leaves_open():
    schema = {
        "type": "object",
        "properties": {
            "s": {"type": "string"},
            "pat": {"type": "string", "pattern": "^a+$"},
            "long": {"type": "string", "maxLength": 50},
            "pick": {"type": "string", "enum": ["x", "y"]},
            "i": {"type": "integer"},
            "from10": {"type": "integer", "minimum": 10},
            "maybe": {"type": ["number", "null"]},
            "tags": {"type": "array", "items": {"type": "string"}},
            "ref": {"anyOf": [{"$ref": "#/$defs/neg"}, {"type": "null"}]},
        },
        "$defs": {"neg": {"type": "integer", "exclusiveMaximum": 0}},
    }
    before = json.dumps(schema)
    out = bound_schema(schema, SMALL)
    p = out["properties"]
    assert list(p) == list(schema["properties"])  # key order kept
    assert p["s"] == {"type": "string", "maxLength": 5}
    assert p["pat"] == {"type": "string", "pattern": "^a+$"}  # the schema's own bounds are kept
    assert p["long"] == {"type": "string", "maxLength": 50}
    assert p["pick"] == {"type": "string", "enum": ["x", "y"]}
    assert (p["i"]["minimum"], p["i"]["maximum"]) == (-999, 999)
    assert (p["from10"]["minimum"], p["from10"]["maximum"]) == (10, 1009)
    assert (p["maybe"]["minimum"], p["maybe"]["maximum"]) == (-999, 999)
    assert p["tags"] == {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 2}
    assert out["$defs"]["neg"] == {"type": "integer", "exclusiveMaximum": 0, "minimum": -999}
    assert json.dumps(schema) == before  # a copy: the request's schema is not changed
    assert bound_schema(schema, JsonBounds(0, 0, 0)) == schema  # 0: unbounded


def test_bounded_integer_and_string_end_in_the_grammar(grammars):
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}, "s": {"type": "string"}},
        "required": ["n", "s"],
        "additionalProperties": False,
    }
    c = grammars.factory(GrammarSpec.json_schema(schema, bounds=SMALL))()
    walk(c, '{"n": -123')
    mask = c.allowed(TINY_VOCAB_SIZE)
    assert not mask[ord("4")] and mask[ord(",")]  # 3 digits at most: the digits cannot loop
    walk(c, ', "s": "')
    mask = c.allowed(TINY_VOCAB_SIZE)
    assert mask[ord("a")] and not mask[0x01] and not mask[ord("\t")]  # no raw control characters
    walk(c, "abcde")
    mask = c.allowed(TINY_VOCAB_SIZE)
    assert int(mask.sum()) == 1 and mask[ord('"')]  # 5 characters: only the closing quote
    walk(c, '"}')
    assert c.is_finished()
    unbounded = grammars.factory(GrammarSpec.json_schema(schema))()
    walk(unbounded, '{"n": -1234567890123456789')  # without bounds the digits go on


def test_schema_key_order_is_kept(grammars):
    schema = {
        "type": "object",
        "properties": {"zeta": {"type": "boolean"}, "alpha": {"type": "boolean"}},
        "required": ["zeta", "alpha"],
    }
    assert GrammarSpec.json_schema(schema).source.index("zeta") < GrammarSpec.json_schema(schema).source.index("alpha")
    c = grammars.factory(GrammarSpec.json_schema(schema, bounds=SMALL))()
    walk(c, '{"')
    mask = c.allowed(TINY_VOCAB_SIZE)
    assert mask[ord("z")] and not mask[ord("a")]  # the schema's first property first, not the sorted one
    walk(c, 'zeta": true, "alpha": false}')
    assert c.is_finished()


def test_bounded_json_object(grammars):
    c = grammars.factory(GrammarSpec.json_object(bounds=SMALL))()
    walk(c, '{"abcde')
    mask = c.allowed(TINY_VOCAB_SIZE)
    assert int(mask.sum()) == 1 and mask[ord('"')]  # keys are bounded strings too
    walk(c, '": [1.5, "x"')
    assert not c.allowed(TINY_VOCAB_SIZE)[ord(",")]  # 2 items at most
    walk(c, '], "b": {"c": null}')
    assert not c.allowed(TINY_VOCAB_SIZE)[ord(",")]  # 2 keys at most
    walk(c, "}")
    assert c.is_finished()
