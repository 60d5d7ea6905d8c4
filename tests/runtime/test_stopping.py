"""Incremental detokenization: the streamed pieces equal the whole output decoded at once, multi-byte
characters split across byte tokens included; stop strings cut exactly where a full decode would."""

from __future__ import annotations

import random

import pytest

from hypic_agent.runtime.models.loading.tokenizer import tiny_tokenizer
from hypic_agent.runtime.stopping import StopChecker

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
