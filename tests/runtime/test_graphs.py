"""Layer-stage CUDA graphs: bucketing, eager fallbacks (CPU here; capture and replay on the H200
in test_gpu_model.py)."""

from __future__ import annotations

import torch

from hypic_agent.runtime.forward import decode_step, prefill
from hypic_agent.runtime.graphs import LayerGraphs, enable_cuda_graphs

from .conftest import make_model, rand_tokens


def test_buckets():
    model, _, _ = make_model("qwen3_5_text")
    r = LayerGraphs(model, buckets=(64, 8, 16))
    assert [r.bucket(n) for n in (1, 8, 9, 64, 65)] == [8, 8, 16, 64, None]
    default = LayerGraphs(model)  # powers of two, 512-token steps, then 128: a cold batch pads by < 128
    got = [default.bucket(n) for n in (200, 513, 1600, 4096, 4097, 4306, 8192, 8193)]
    assert got == [256, 1024, 2048, 4096, 4224, 4352, 8192, None]


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


def test_combine_stages_split_like_the_layer():
    """combine runs mixer_in / eager mixer core / mixer_out: same logits with a runner attached (it
    stays eager off CUDA) and the stage functions compose to the whole layer."""
    from hypic_agent.runtime.hypic.build import build_entries
    from hypic_agent.runtime.hypic.combine import combine
    from hypic_agent.runtime.hypic.layout import plan_layout
    from hypic_agent.runtime.hypic.modes import mode_spec

    model, _, _ = make_model("qwen3_5_moe_text")
    segs = [tuple(rand_tokens(12, s)) for s in range(3)]
    entries = build_entries(model, segs, [4, 4, 4])
    lay = plan_layout(list(segs), list(entries), [4, 4, 4], rand_tokens(5, 9), torch.device("cpu"))
    ref = combine(model, lay, list(entries), mode_spec("hypic"))
    enable_cuda_graphs(model)
    got = combine(model, lay, list(entries), mode_spec("hypic"))
    assert torch.equal(ref.last_logits, got.last_logits)


def test_padding_rows_are_zeroed_after_a_longer_input():
    """Input buffers are shared by all buckets: rows a longer earlier input wrote are cleared when a
    shorter one follows (stale hidden states in padding rows would pick experts of their own), and
    same-size inputs pay no clearing."""
    model, _, _ = make_model("qwen3_5_text")
    r = LayerGraphs(model, buckets=(8, 16))
    x16 = torch.randn(16, 4)
    big, small = r._buffers("s", 16, (x16,))[0], r._buffers("s", 8, (x16,))[0]
    assert big.data_ptr() == small.data_ptr()  # one base buffer, two bucket views
    r._load(big, torch.ones(13, 4))
    assert torch.equal(big[:13], torch.ones(13, 4)) and not big[13:].any()
    r._load(small, torch.full((3, 4), 2.0))
    assert torch.equal(big[:3], torch.full((3, 4), 2.0)) and not big[3:].any()  # rows 3..12 cleared
    assert r._live[big.data_ptr()] == 3
