"""Span gather: the torch twin's semantics and the dispatcher's errors (the Triton kernel against
the twin: test_triton_interpreter.py on CPU, test_gpu_ops.py on the H200)."""

from __future__ import annotations

import pytest
import torch

from hypic_agent.kernels.gather_spans import gather_spans, gather_spans_torch, span_table


def test_twin_copies_spans_and_zero_fills_missing_sources():
    a, b = torch.arange(6.0), torch.arange(10.0, 14.0)
    dst = torch.full((12,), -1.0)
    gather_spans_torch([a, None, b], [0, 6, 8], [5, 2, 4], dst)
    assert dst.tolist() == [0, 1, 2, 3, 4, -1, 0, 0, 10, 11, 12, 13]


def test_span_table_layout():
    t = span_table([(123, 0, 5), (0, 5, 2)])
    assert t.dtype == torch.int64 and t.tolist() == [[123, 0, 5], [0, 5, 2]]
    assert span_table([]).shape == (0, 3)


def test_bad_calls_say_what_to_fix():
    dst = torch.zeros(8)
    with pytest.raises(ValueError, match=r"\[N, 3\] int64"):
        gather_spans(torch.zeros(2, 2, dtype=torch.int64), dst, 4)
    with pytest.raises(ValueError, match="contiguous"):
        gather_spans(span_table([(0, 0, 2)]), torch.zeros(4, 2).t(), 2)
    with pytest.raises(ValueError, match="Triton"):
        gather_spans(span_table([(0, 0, 2)]), dst, 2, backend="torch")
    assert gather_spans(span_table([]), dst, 0) is dst  # nothing to do
