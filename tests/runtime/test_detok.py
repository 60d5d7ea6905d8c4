"""``core_process.detok``: a request the engine process streams as ids only gets, in the API process,
the text the engine would have made, piece by piece and whole (multi-byte characters split across
byte tokens included), from events that carried no text."""

from __future__ import annotations

import pytest

from hypic_agent.runtime.core_process.detok import Detokenizer
from hypic_agent.runtime.models.loading.tokenizer import tiny_tokenizer
from hypic_agent.runtime.output import OutputStream
from hypic_agent.runtime.results import FinishEvent, Prepared, TokenEvent
from hypic_agent.runtime.sampling import SamplingParams

TEXT = "Größe: 12 €, naïve café — ok"


def _events(detokenize: bool) -> list[TokenEvent | FinishEvent]:
    tok = tiny_tokenizer()
    ids = tok.encode(TEXT, add_special_tokens=False)
    out = OutputStream(tok, SamplingParams(max_tokens=len(ids), detokenize=detokenize), eos_ids=())
    events: list[TokenEvent | FinishEvent] = []
    for t in ids:
        events += out.push(t, -0.5)
    return events + out.finish(Prepared(None, "full_recompute", [], 4, 0, 4), 1.0, 2.0)


def test_ids_only_events_get_the_engines_text() -> None:
    engine = _events(detokenize=True)
    remote = _events(detokenize=False)
    assert all(e.text == "" for e in remote)  # what the engine process sent: no text made there
    d = Detokenizer(tiny_tokenizer())
    here = [ev for e in remote for ev in d.events(e)]
    assert [(e.text, e.token_id) for e in here if isinstance(e, TokenEvent)] == [
        (e.text, e.token_id) for e in engine if isinstance(e, TokenEvent)
    ]
    fin = here[-1]
    assert isinstance(fin, FinishEvent) and fin.text == TEXT == engine[-1].text
    assert fin.token_ids == engine[-1].token_ids and fin.finish_reason == "length"


def test_stop_strings_keep_the_text_in_the_engine() -> None:
    with pytest.raises(ValueError, match="detokenize"):
        SamplingParams(stop=("ok",), detokenize=False).validate()
