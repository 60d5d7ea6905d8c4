"""``seam="auto"`` / ``"blend"`` on the wire: generate accepts them and reuses entries; pre-warm refuses them."""

from __future__ import annotations

import pytest

from tests.api.conftest import BERLIN, PARIS, doc

SYSTEM = {"kind": "system", "text": "You answer from the documents, briefly and exactly."}


@pytest.mark.parametrize("seam", ["auto", "blend"])
def test_generate_with_auto_seams_reuses_entries(client, seam):
    body = {"query": "What is the capital?", "max_tokens": 2, "seam": seam}
    first = client.post("/v1/generate", json={"segments": [SYSTEM, doc(PARIS), doc(BERLIN)], **body})
    assert first.status_code == 200, first.text
    again = client.post("/v1/generate", json={"segments": [SYSTEM, doc(PARIS), doc(BERLIN)], **body})
    u = again.json()["usage"]
    assert all(s["hit"] for s in u["segments"])
    assert 0 < u["cached_tokens"] <= u["prompt_tokens"]
    # the system prompt opens the prompt: no seam, every token of it served from its entry
    sys_tokens = u["segments"][0]["tokens"]
    docs_tokens = sum(s["tokens"] for s in u["segments"][1:])
    assert u["cached_tokens"] >= sys_tokens + docs_tokens - int(0.03 * (sys_tokens + docs_tokens))


@pytest.mark.parametrize("seam", ["auto", "blend"])
def test_auto_seam_is_refused_for_prewarm_and_bad_words_are_400(client, seam):
    r = client.put("/v1/segments", json={"segments": [doc(PARIS)], "seam": seam})
    assert r.status_code == 400 and r.json()["error"]["param"] == "seam"
    r = client.post("/v1/generate", json={"segments": [doc(PARIS)], "query": "q", "seam": "wide"})
    assert r.status_code in (400, 422)
