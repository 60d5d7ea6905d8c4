"""``probe``: the combine forward with every active row kept agrees with ``combine`` and the one pass."""

from __future__ import annotations

import pytest
import torch

from hypic_agent.runtime.hypic.build import build_entries
from hypic_agent.runtime.hypic.combine import combine
from hypic_agent.runtime.hypic.layout import plan_layout
from hypic_agent.runtime.hypic.modes import mode_spec
from hypic_agent.runtime.hypic.probe import probe
from hypic_agent.runtime.runner.standalone import prefill

from .conftest import make_model, rand_tokens

CPU = torch.device("cpu")


@pytest.mark.parametrize("arch", ["qwen3_5_text", "llama"])
def test_probe_matches_one_pass_and_combine(arch):
    model, _, _ = make_model(arch)
    segs = [tuple(rand_tokens(n, i)) for i, n in enumerate((20, 17, 25))]
    suffix = rand_tokens(5, 9)
    flat = [t for s in segs for t in s] + suffix
    spec = mode_spec("hypic")
    # no entries: the one-pass forward, every row
    full = probe(model, plan_layout(segs, [None] * 3, [0] * 3, suffix, CPU), [None] * 3, spec)
    ref = prefill(model, [flat], all_logits=True)[0]
    assert full.hidden.shape == (len(model.layers) + 1, len(flat), model.config.hidden_size)
    assert torch.allclose(full.logits, ref.all_logits.float(), atol=1e-4)
    # entries with seams: last row equals combine's logits; active rows are the seams and the suffix
    seams = [4, 4, 4]
    entries = build_entries(model, segs, seams)
    lay = plan_layout(segs, entries, seams, suffix, CPU)
    got = probe(model, lay, entries, spec)
    st = combine(model, lay, entries, spec)
    assert torch.allclose(got.logits[-1], st.last_logits.float(), atol=1e-5)
    assert got.positions.tolist() == [0, 1, 2, 3, 20, 21, 22, 23, 37, 38, 39, 40, *range(62, 67)]
    # the first seam sees nothing before it: its rows equal the one pass exactly
    assert torch.allclose(got.hidden[:, :4], full.hidden[:, :4], atol=1e-5)
    assert not torch.allclose(got.hidden[-1, -1], full.hidden[-1, -1], atol=1e-3)
