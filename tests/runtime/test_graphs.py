"""Feed-forward CUDA graphs: bucketing, eager fallbacks (CPU here; capture and replay on the H200
in test_gpu_model.py)."""

from __future__ import annotations

import torch

from hypic_agent.runtime.forward import decode_step, prefill
from hypic_agent.runtime.graphs import FeedForwardGraphs, enable_cuda_graphs

from .conftest import make_model, rand_tokens


def test_buckets():
    model, _, _ = make_model("qwen3_5_text")
    r = FeedForwardGraphs(model, buckets=(64, 8, 16))
    assert [r.bucket(n) for n in (1, 8, 9, 64, 65)] == [8, 8, 16, 64, None]


def test_cpu_runs_eagerly_and_matches():
    model, _, _ = make_model("qwen3_5_moe_text")
    seqs = [rand_tokens(20, 1), rand_tokens(7, 2)]
    ref = prefill(model, seqs)
    runner = enable_cuda_graphs(model)
    got = prefill(model, seqs)
    for a, b in zip(ref, got):
        assert torch.equal(a.last_logits, b.last_logits)
    decode_step(model, got, [3, 4])
    assert runner._graphs == {} and runner.disabled is None  # nothing captured off CUDA
