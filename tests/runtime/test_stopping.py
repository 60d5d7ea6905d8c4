"""Incremental detokenization: the streamed pieces equal the whole output decoded at once, multi-byte
characters split across byte tokens included (the tiny byte tokenizer and the shipped BPE one); stop
strings cut exactly where a full decode would; every push equals the whole-text reference's; the kept
text stays bounded; the Rust decode is called directly only where transformers' decode is exactly it."""

from __future__ import annotations

import functools
import random
from pathlib import Path

import pytest

from hypic_agent.runtime.models.loading.tokenizer import tiny_tokenizer
from hypic_agent.runtime.stopping import StopChecker, text_decoder

TEXTS = ["plain ascii words, with spaces", "caf\u00e9 na\u00efve \u65e5\u672c\u8a9e \U0001f600 end", "a" * 300]


@pytest.mark.parametrize("text", TEXTS)
def test_streamed_pieces_equal_the_whole_decode(text):
    tok = tiny_tokenizer()
    ids = tok.encode(text, add_special_tokens=False)
    sc = StopChecker(tok)
    pieces = [sc.push(t) for t in ids] + [sc.flush()]
    assert "".join(pieces) == tok.decode(ids, skip_special_tokens=True) == text
    assert all("\ufffd" not in p for p in pieces)  # never a half character


def test_stop_strings_cut_where_a_full_decode_would():
    tok = tiny_tokenizer()
    rng = random.Random(0)
    for _ in range(50):
        words = [rng.choice(["alpha", "beta", "STOP", "\u00e9t\u00e9", "x", "\n\n", "ST"]) for _ in range(12)]
        text = " ".join(words)
        stops = ("STOP", "\n\n")
        ids = tok.encode(text, add_special_tokens=False)
        sc = StopChecker(tok, stops)
        out = []
        for t in ids:
            out.append(sc.push(t))
            if sc.stopped:
                break
        out.append(sc.flush())
        cut = min((i for i in (text.find(s) for s in stops) if i != -1), default=len(text))
        assert "".join(out) == text[:cut], (text, stops)
        assert sc.stopped == (cut < len(text))


def test_each_token_decodes_a_short_window_not_the_whole_output():
    tok = tiny_tokenizer()
    seen: list[int] = []

    class Spy:
        def decode(self, ids, skip_special_tokens=True):
            seen.append(len(ids))
            return tok.decode(ids, skip_special_tokens=skip_special_tokens)

    ids = tok.encode("word " * 200, add_special_tokens=False)
    sc = StopChecker(Spy(), ("never",))
    text = "".join(sc.push(t) for t in ids) + sc.flush()
    assert text == "word " * 200
    assert max(seen) <= 4  # a few ids per call (byte tokens, one char each), never the 1,000 so far


# ------------------------------------------------------------------ the shipped BPE tokenizer, and a reference
SHIPPED = Path(__file__).resolve().parents[2] / "hypic_agent" / "weights" / "smollm2-135m-hybrid"
LONG = (
    "Grüße aus Köln! 日本語のテキストと中文混合，还有 emoji 😀🎉👩‍👩‍👧 and ascii — «quotes», ŝpécial "
    "çhars, Ελληνικά, русский текст, עברית, हिन्दी, 한국어. "
) * 12


@pytest.fixture(scope="module")
def shipped():
    from hypic_agent.runtime.models.loading.tokenizer import load_tokenizer

    if not (SHIPPED / "tokenizer.json").is_file():
        pytest.skip(f"the shipped model's tokenizer is not at {SHIPPED}")
    return load_tokenizer(SHIPPED)


class ReferenceStopChecker:
    """The checker before the window and tail were bounded: the whole text kept, ``tokenizer.decode``."""

    def __init__(self, tokenizer, stop=()):
        self.tokenizer, self.stop = tokenizer, tuple(stop)
        self.ids: list[int] = []
        self.text, self.emitted, self.stopped, self._prefix, self._read = "", 0, False, 0, 0

    def _decode(self, ids):
        return self.tokenizer.decode(ids, skip_special_tokens=True) if ids else ""

    def _advance(self, final=False):
        before = len(self.text)
        head, full = self._decode(self.ids[self._prefix : self._read]), self._decode(self.ids[self._prefix :])
        if final:
            full = full.rstrip("\ufffd")
        elif full.endswith("\ufffd"):
            return before
        if len(full) > len(head):
            self.text += full[len(head) :]
            self._prefix, self._read = self._read, len(self.ids)
        return before

    def push(self, token_id):
        self.ids.append(token_id)
        before = self._advance()
        text = self.text
        if len(text) == before:
            return ""
        start = max(0, before - max((len(s) for s in self.stop), default=0) + 1)
        for s in self.stop:
            i = text.find(s, start)
            if i != -1:
                self.stopped = True
                out = text[self.emitted : i] if i > self.emitted else ""
                self.emitted = max(self.emitted, i)
                return out
        hold = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:n]):
                    hold = max(hold, n)
                    break
        release_to = len(text) - hold
        out = text[self.emitted : release_to] if release_to > self.emitted else ""
        self.emitted = max(self.emitted, release_to)
        return out

    def flush(self):
        if self.stopped:
            return ""
        self._advance(final=True)
        out, self.emitted = self.text[self.emitted :], len(self.text)
        return out


def test_a_long_multibyte_text_streams_exactly_as_decoded_at_once(shipped):
    for tok in (shipped, tiny_tokenizer()):
        ids = tok.encode(LONG, add_special_tokens=False)
        assert len(ids) > 500
        sc = StopChecker(tok)
        pieces = [sc.push(t) for t in ids] + [sc.flush()]
        assert "".join(pieces) == tok.decode(ids, skip_special_tokens=True) == LONG
        assert all("\ufffd" not in p for p in pieces)


@pytest.mark.parametrize("which", ["shipped", "tiny"])
def test_every_push_equals_the_whole_text_reference(which, shipped):
    """Random streams (split multi-byte characters, special tokens, stop strings of 1-6 characters that
    match, straddle pushes or never match): every piece, the stop and the flush equal the reference's."""
    tok = shipped if which == "shipped" else tiny_tokenizer()
    rng = random.Random(7)
    base = tok.encode(LONG, add_special_tokens=False)
    special = list(tok.all_special_ids)
    for trial in range(40):
        start = rng.randrange(len(base) - 200)
        ids = base[start : start + rng.randint(20, 200)]
        if trial % 3 == 0:  # random ids: invalid byte sequences, specials, whatever the model samples
            ids = [rng.choice(special) if rng.random() < 0.05 else rng.randrange(len(tok)) for _ in ids]
        text = tok.decode(ids, skip_special_tokens=True)
        stops = tuple(
            text[i : i + rng.randint(1, 6)] if text and rng.random() < 0.6 else "\u00a7never" + str(k)
            for k, i in enumerate(rng.randrange(max(1, len(text))) for _ in range(rng.randint(0, 3)))
        )
        mine, ref = StopChecker(tok, stops), ReferenceStopChecker(tok, stops)
        for t in ids:
            assert mine.push(t) == ref.push(t), (trial, stops)
            assert mine.stopped == ref.stopped
            if ref.stopped:
                break
        assert mine.flush() == ref.flush()


def test_the_kept_text_stays_bounded_by_the_stop_strings():
    tok = tiny_tokenizer()
    sc = StopChecker(tok, ("never", "xyz"))
    out = "".join(sc.push(t) for t in tok.encode("word " * 2000, add_special_tokens=False)) + sc.flush()
    assert out == "word " * 2000
    assert len(sc._held) < len("never") and len(sc._window) <= 2


def test_text_decoder_calls_the_rust_decode_only_where_transformers_would_add_nothing(shipped):
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(3)
    for tok in (shipped, tiny_tokenizer()):
        dec = text_decoder(tok)
        assert dec.func == tok._tokenizer.decode  # type: ignore[attr-defined]
        for _ in range(200):
            ids = [rng.randrange(len(tok)) for _ in range(rng.randint(0, 6))]
            assert dec(ids) == tok.decode(ids, skip_special_tokens=True)

    class Shouting(PreTrainedTokenizerFast):  # an override of decode is kept
        def decode(self, ids, skip_special_tokens=False, **kw):
            return super().decode(ids, skip_special_tokens=skip_special_tokens, **kw).upper()

    loud = Shouting(tokenizer_object=tiny_tokenizer()._tokenizer)
    assert text_decoder(loud)([104, 105]) == "HI"
    clean = PreTrainedTokenizerFast(tokenizer_object=tiny_tokenizer()._tokenizer, clean_up_tokenization_spaces=True)
    assert not isinstance(text_decoder(clean), functools.partial)  # through clean.decode
    assert text_decoder(clean)([104, 32, 46]) == clean.decode([104, 32, 46], skip_special_tokens=True)
