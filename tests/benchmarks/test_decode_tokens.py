"""``_common.decode_tokens``: the runner benchmarks feed every row its own token each step, as a served
batch does (one token for all rows routes an MoE batch to the same few experts and reads a fraction
of the weights a served batch reads)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from _common import decode_tokens


def test_rows_get_different_tokens_within_the_vocabulary():
    toks = decode_tokens(64, 1000, 0)
    flat = [t for (t,) in toks]
    assert len(flat) == 64 and len(set(flat)) == 64
    assert all(1 <= t < 1000 for t in flat)


def test_steps_differ_and_repeat_across_runs():
    assert decode_tokens(8, 50_000, 1) != decode_tokens(8, 50_000, 2)
    assert decode_tokens(8, 50_000, 1) == decode_tokens(8, 50_000, 1)  # seeded: every run times the same feed
