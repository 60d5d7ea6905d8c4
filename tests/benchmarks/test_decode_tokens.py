"""``_common.decode_tokens``: the runner benchmarks feed every row its own token each step, as a served
batch does (one token for all rows routes an MoE batch to the same few experts and reads a fraction
of the weights a served batch reads)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

# loaded under a name of its own: ``tests/examples`` imports the examples' ``_common`` by that name
_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "_common.py"
_SPEC = importlib.util.spec_from_file_location("benchmarks_common", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
_MOD = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_MOD)
decode_tokens = _MOD.decode_tokens


def test_rows_get_different_tokens_within_the_vocabulary():
    toks = decode_tokens(64, 1000, 0)
    flat = [t for (t,) in toks]
    assert len(flat) == 64 and len(set(flat)) == 64
    assert all(1 <= t < 1000 for t in flat)


def test_steps_differ_and_repeat_across_runs():
    assert decode_tokens(8, 50_000, 1) != decode_tokens(8, 50_000, 2)
    assert decode_tokens(8, 50_000, 1) == decode_tokens(8, 50_000, 1)  # seeded: every run times the same feed
