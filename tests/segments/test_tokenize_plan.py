"""Per-segment tokenization, keys and the prompt plan."""

from __future__ import annotations

import pytest

from hypic_agent.errors import ContextLengthError, InvalidRequestError, SegmentNotFoundError
from hypic_agent.segments.prompt.framing import Framer
from hypic_agent.segments.prompt.keys import KeyContext, segment_key, token_digest
from hypic_agent.segments.prompt.kinds import Message, Segment
from hypic_agent.segments.prompt.plan import PromptPlan, build_plan
from hypic_agent.segments.prompt.resolve import stored_resolver
from hypic_agent.segments.prompt.tokenize import CanonicalSegment, canonicalize, detect_bos, encode, encode_many
from hypic_agent.segments.store.record import EntryRecord

CTX = KeyContext(model_fingerprint="tiny-fp", tenant="acme", seam=8)
SEGS = [
    Segment(kind="system", text="You answer from the documents."),
    Segment(kind="document", text="Paris is the capital of France.", title="Paris"),
    Segment(kind="turn", messages=(Message("user", "hello"), Message("assistant", "hello world"))),
]


def test_each_segment_tokenized_on_its_own(chat_tokenizer):
    for seg in SEGS:
        c = canonicalize(seg, chat_tokenizer, CTX)
        assert c.token_ids == tuple(chat_tokenizer.encode(c.text, add_special_tokens=False))
        assert chat_tokenizer.bos_token_id not in c.token_ids
        assert c.key == CTX.key(c.token_ids) and c.digest == token_digest(c.token_ids)
        assert c.n_tokens == len(c.token_ids) > 0


def test_batched_encoding_equals_one_text_at_a_time(chat_tokenizer):
    """``build_plan`` tokenizes a prompt's content segments in one batched call: the same ids, keys and
    order as each segment alone, around segments given by id."""
    texts = ["Paris is the capital of France.", "  two  spaces ", "émoji ✓ and\nnewline", "x"]

    class OneCall:  # the batch is one call of the tokenizer, never one ``encode`` per text
        calls = 0

        def __call__(self, batch, **kw):
            OneCall.calls += 1
            return chat_tokenizer(batch, **kw)

        def encode(self, *args, **kw):
            raise AssertionError("encoded one text at a time")

    assert encode_many(OneCall(), texts) == [encode(chat_tokenizer, t) for t in texts] and OneCall.calls == 1
    plan = build_plan(SEGS, None, chat_tokenizer, CTX)
    assert [c.token_ids for c in plan.segments] == [canonicalize(s, chat_tokenizer, CTX).token_ids for s in SEGS]
    assert [c.key for c in plan.segments] == [canonicalize(s, chat_tokenizer, CTX).key for s in SEGS]


def test_plan_is_the_concatenation(chat_tokenizer):
    plan = build_plan(SEGS, "What is the capital of France?", chat_tokenizer, CTX)
    assert plan.bos_id is None  # this tokenizer adds no BOS on its own
    ids = plan.token_ids()
    assert ids == [t for s in plan.segments for t in s.token_ids] + list(plan.suffix_ids)
    assert plan.total_tokens == len(ids)
    offs = plan.offsets()
    assert offs[0] == 0 and all(ids[o : o + s.n_tokens] == list(s.token_ids) for o, s in zip(offs, plan.segments))
    assert plan.suffix_offset == offs[-1] + plan.segments[-1].n_tokens
    text = chat_tokenizer.decode(plan.suffix_ids)
    assert text.endswith("<|im_start|>assistant\n") and "capital" in text
    # same segments anywhere give the same keys: no parent hash
    swapped = build_plan(SEGS[::-1], "q", chat_tokenizer, CTX)
    assert swapped.keys() == plan.keys()[::-1]


def test_bos_is_its_own_piece(chat_tokenizer):
    plan = build_plan(SEGS[:2], "q", chat_tokenizer, CTX, add_bos=True)
    bos = chat_tokenizer.bos_token_id
    assert plan.bos_id == bos and plan.token_ids()[0] == bos and plan.offsets()[0] == 1
    assert plan.total_tokens == 1 + plan.segment_tokens + len(plan.suffix_ids)
    assert plan.keys() == build_plan(SEGS[:2], "q", chat_tokenizer, CTX).keys()


def test_detect_bos():
    class Tok:
        bos_token_id = 7

        def encode(self, text, add_special_tokens=False):
            return ([7] if add_special_tokens else []) + [ord(c) for c in text]

    assert detect_bos(Tok()) == 7  # type: ignore[arg-type]
    plan = build_plan([Segment(kind="text", text="ab")], None, Tok(), CTX, framer=Framer(None))  # type: ignore[arg-type]
    assert plan.token_ids() == [7, 97, 98, *[ord(c) for c in "assistant:"]]


def test_plan_errors(chat_tokenizer):
    with pytest.raises(InvalidRequestError, match="prompt is empty"):
        build_plan([], None, chat_tokenizer, CTX)
    for blank in ("", "  "):  # an empty query is a prompt: the generation prompt alone
        assert build_plan([], blank, chat_tokenizer, CTX).suffix_ids
    with pytest.raises(InvalidRequestError, match="prompt is empty"):
        PromptPlan(segments=(), suffix_ids=())
    only_suffix = build_plan([], "hello", chat_tokenizer, CTX)
    assert only_suffix.segments == () and only_suffix.offsets() == [] and only_suffix.total_tokens > 0
    with pytest.raises(InvalidRequestError, match="no store"):
        build_plan([Segment(kind=None, ref="x")], "q", chat_tokenizer, CTX)
    with pytest.raises(ContextLengthError, match="context limit 10"):
        build_plan(SEGS, "q", chat_tokenizer, CTX).check_fits(10, 4)
    with pytest.raises(InvalidRequestError, match="zero tokens"):
        CanonicalSegment(kind="text", token_ids=(), key=CTX.key([]), text="")


def test_keys_bind_everything():
    ids = [1, 2, 3]
    base = segment_key(ids, model_fingerprint="m", tenant="t", seam=8)
    assert len(base) == 32 and base == segment_key(ids, model_fingerprint="m", tenant="t", seam=8.0)
    # golden value: it may only change together with FORMAT_VERSION (else stored entries silently miss)
    assert base == "95aaf6a28eac41f01edb35fda8d6afd1"
    others = {
        segment_key(ids, model_fingerprint="m2", tenant="t", seam=8),
        segment_key(ids, model_fingerprint="m", tenant="t2", seam=8),
        segment_key(ids, model_fingerprint="m", tenant="t", seam=4),
        segment_key(ids, model_fingerprint="m", tenant="t", seam=0.25),
        segment_key([1, 2, 4], model_fingerprint="m", tenant="t", seam=8),
        segment_key(ids, model_fingerprint="m", tenant="t", seam=8, format_version=999),
        # field boundaries are length-prefixed: moving a character across fields changes the key
        segment_key(ids, model_fingerprint="mt", tenant="", seam=8),
    }
    assert base not in others and len(others) == 7
    with pytest.raises(InvalidRequestError):
        segment_key([-1], model_fingerprint="m", tenant="t", seam=8)
    with pytest.raises(InvalidRequestError):
        KeyContext(model_fingerprint="m", seam=-1)


def test_key_is_stable_across_processes():
    import subprocess
    import sys

    code = (
        "from hypic_agent.segments.prompt.keys import segment_key\n"
        "print(segment_key([5, 6], model_fingerprint='m', tenant='t', seam=8))"
    )
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout for _ in range(2)}
    assert outs == {segment_key([5, 6], model_fingerprint="m", tenant="t", seam=8) + "\n"}


def test_resolve_stored_ids(chat_tokenizer):
    doc = canonicalize(SEGS[1], chat_tokenizer, CTX)
    rec = EntryRecord(
        key=doc.key, tenant="acme", kind="document", n_tokens=doc.n_tokens, model_fingerprint="tiny-fp",
        created_at=0.0, last_used_at=0.0, token_ids=doc.token_ids, token_digest=doc.digest, text=doc.text,
        title="Paris",
    )  # fmt: skip
    rows = {(doc.key, "acme"): rec}
    resolve = stored_resolver(lambda k, t: rows.get((k, t)), CTX)
    plan = build_plan([SEGS[0], Segment(kind=None, ref=doc.key)], "q", chat_tokenizer, CTX, resolve=resolve)
    got = plan.segments[1]
    assert got.token_ids == doc.token_ids and got.key == doc.key and got.ref == doc.key and got.title == "Paris"
    seam4 = KeyContext(model_fingerprint="tiny-fp", tenant="acme", seam=4)
    assert stored_resolver(lambda k, t: rows.get((k, t)), seam4)(Segment(kind=None, ref=doc.key)).key == seam4.key(
        doc.token_ids
    )
    with pytest.raises(SegmentNotFoundError, match="PUT /v1/segments"):
        resolve(Segment(kind=None, ref="nope"))
    other_tenant = KeyContext(model_fingerprint="tiny-fp", tenant="evil")
    with pytest.raises(SegmentNotFoundError):
        stored_resolver(lambda k, t: rows.get((k, t)), other_tenant)(Segment(kind=None, ref=doc.key))
    with pytest.raises(InvalidRequestError, match="not 'memory'"):
        resolve(Segment(kind="memory", ref=doc.key))
    other_model = KeyContext(model_fingerprint="other", tenant="acme")
    with pytest.raises(SegmentNotFoundError, match="another model"):
        stored_resolver(lambda k, t: rows.get((k, t)), other_model)(Segment(kind=None, ref=doc.key))
