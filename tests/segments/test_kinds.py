"""Wire models of segments and their validation errors."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from hypic_agent.errors import InvalidRequestError
from hypic_agent.segments.prompt.kinds import CachePolicy, Message, Segment, SegmentIn, parse_segment


class Request(BaseModel):
    segments: list[SegmentIn]


def _errors(obj) -> list[dict]:
    with pytest.raises(ValidationError) as exc:
        parse_segment(obj)
    return exc.value.errors(include_url=False)


@pytest.mark.parametrize("kind", ["system", "document", "skill", "memory", "text"])
def test_text_kinds_parse(kind):
    seg = parse_segment({"kind": kind, "text": "Paris.", "title": "P", "metadata": {"src": 1}, "cache": {"pin": True}})
    assert seg == Segment(kind=kind, text="Paris.", title="P", metadata={"src": 1}, cache=CachePolicy(pin=True))
    assert seg.metadata["src"] == 1 and not seg.is_ref


def test_turn_and_ref_parse():
    seg = parse_segment({"kind": "turn", "messages": [{"role": "user", "content": "hi"}]})
    assert seg.kind == "turn" and seg.messages == (Message("user", "hi"),)
    ref = parse_segment({"id": "abc", "cache": {"ttl": 60}})
    assert ref.is_ref and ref.kind is None and ref.cache.ttl == 60
    typed_ref = parse_segment({"kind": "document", "id": "abc"})
    assert typed_ref.kind == "document" and typed_ref.ref == "abc"


def test_union_in_a_request_model():
    req = Request.model_validate(
        {
            "segments": [
                {"kind": "system", "text": "s"},
                {"id": "k1"},
                {"kind": "turn", "messages": [{"role": "assistant", "content": "a"}]},
            ]
        }
    )
    assert [type(s).__name__ for s in req.segments] == ["SystemSegmentIn", "SegmentRefIn", "TurnSegmentIn"]


@pytest.mark.parametrize(
    "obj, fragment",
    [
        ({"kind": "doc", "text": "x"}, "'kind' must be one of system, document"),
        ({"text": "x"}, "'kind' must be one of"),
        ({"kind": "document", "text": "   "}, "must not be empty"),
        ({"kind": "document", "text": "a", "id": "b"}, "exactly one of 'text' or 'id' (both given)"),
        ({"kind": "memory"}, "exactly one of 'text' or 'id' (neither given)"),
        ({"kind": "turn", "messages": []}, "at least one message"),
        ({"kind": "turn", "text": "hi"}, "Extra inputs are not permitted"),
        ({"kind": "turn", "messages": [{"role": "robot", "content": "x"}]}, "Input should be 'system', 'user'"),
        ({"kind": "document", "txt": "typo"}, "Extra inputs are not permitted"),
        ({"kind": "document", "text": "a", "cache": {"ttl": 0}}, "greater than 0"),
    ],
)
def test_validation_errors_say_what_to_fix(obj, fragment):
    msgs = " | ".join(e["msg"] for e in _errors(obj))
    assert fragment in msgs, msgs


def test_segment_dataclass_checks():
    with pytest.raises(InvalidRequestError, match="exactly one of text, messages or id"):
        Segment(kind="document", text="a", ref="b")
    with pytest.raises(InvalidRequestError, match="needs a kind"):
        Segment(kind=None, text="a")
    with pytest.raises(InvalidRequestError, match="unknown segment kind"):
        Segment(kind="blob", text="a")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="only for kind 'turn'"):
        Segment(kind="document", messages=(Message("user", "x"),))
    with pytest.raises(InvalidRequestError, match="ttl"):
        CachePolicy(ttl=-1)
    seg = Segment(kind="text", text="x", metadata={"a": 1})
    with pytest.raises(TypeError):
        seg.metadata["a"] = 2  # type: ignore[index]
    with pytest.raises(AttributeError):
        seg.text = "y"  # type: ignore[misc]
