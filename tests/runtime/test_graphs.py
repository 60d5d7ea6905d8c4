"""Layer-stage CUDA graphs: bucketing and the shared buffers (CPU here; capture and replay against
eager on the H200 in test_gpu_model.py)."""

from __future__ import annotations

import torch

from hypic_agent.runtime.runner.stage_graphs import LayerGraphs, bucket_sizes

from .conftest import make_model


def test_buckets():
    model, _, _ = make_model("qwen3_5_text")
    r = LayerGraphs(model, buckets=(64, 8, 16))
    assert [r.bucket(n) for n in (1, 8, 9, 64, 65)] == [8, 8, 16, 64, None]
    default = LayerGraphs(model)  # powers of two up to KernelConfig.graph_max_tokens (1,024)
    got = [default.bucket(n) for n in (1, 200, 513, 1024, 1025, 4096)]
    assert got == [8, 256, 1024, 1024, None, None]
    assert default.buckets == bucket_sizes(128) == (8, 16, 32, 64, 128, 256, 512, 1024)
    wide = LayerGraphs(model, bucket_sizes(128, 8192))  # 512-token steps, then 128: a cold batch pads by < 128
    got = [wide.bucket(n) for n in (200, 513, 1600, 4096, 4097, 4306, 8192, 8193)]
    assert got == [256, 1024, 2048, 4096, 4224, 4352, 8192, None]
    step = bucket_sizes(512, 8192)  # KernelConfig.graph_bucket_step
    assert step[:10] == wide.buckets[:10] and step[9:] == tuple(range(2048, 8192 + 1, 512))


def test_padding_rows_are_zeroed_after_a_longer_input():
    """Input buffers are shared by all buckets: rows a longer earlier input wrote are cleared when a
    shorter one follows (stale hidden states in padding rows would pick experts of their own), and
    same-size inputs pay no clearing."""
    model, _, _ = make_model("qwen3_5_text")
    r = LayerGraphs(model, buckets=(8, 16))
    x16 = torch.randn(16, 4)
    big, small = r._buffers("s", 16, [x16])[0], r._buffers("s", 8, [x16])[0]
    assert big.data_ptr() == small.data_ptr()  # one base buffer, two bucket views
    r._load(big, (torch.ones(13, 4),))
    assert torch.equal(big[:13], torch.ones(13, 4)) and not big[13:].any()
    r._load(small, (torch.full((3, 4), 2.0),))
    assert torch.equal(big[:3], torch.full((3, 4), 2.0)) and not big[3:].any()  # rows 3..12 cleared
    assert r._live[big.data_ptr()] == 3


def test_chained_stages_share_buffers_and_skip_copies():
    """The hidden states' buffer is mixer_in's input and mixer_out's input and output; the output
    gate's is mixer_in's output and mixer_out's input. An input that already is its buffer is not
    copied (nor its padding rows cleared); row parts are stacked into the buffer."""
    model, _, _ = make_model("qwen3_5_text")
    r = LayerGraphs(model, buckets=(8, 16))
    h, z, g = torch.randn(16, 4), torch.randn(16, 2, 3), torch.randn(16, 2)
    (h_in,) = r._buffers("mixer_in", 16, [h])
    mixed, z_out, g_out, beta_out = r._buffers("out:mixer_in", 16, [h, z, g, g])
    h_mo, o_mo, z_mo = r._buffers("mixer_out", 16, [h, z, z])
    (h_out,) = r._buffers("out:mixer_out", 16, [h])
    assert h_in.data_ptr() == h_mo.data_ptr() == h_out.data_ptr()
    assert z_out.data_ptr() == z_mo.data_ptr()
    assert len({t.data_ptr() for t in (mixed, z_out, g_out, beta_out, o_mo)} | {h_in.data_ptr()}) == 6
    h_out[:16].fill_(5.0)  # a graph wrote all 16 rows
    r._live[h_out.data_ptr()] = 16
    r._load(h_in, (h_out[:13],))  # the view of its own buffer: left as it is
    assert torch.equal(h_in, torch.full((16, 4), 5.0))
    r._load(o_mo, (torch.ones(3, 2, 3), torch.full((2, 2, 3), 2.0)))  # parts, stacked
    assert torch.equal(o_mo[:3], torch.ones(3, 2, 3)) and torch.equal(o_mo[3:5], torch.full((2, 2, 3), 2.0))
    # two slots of one stage with one shape never share a buffer, even in a group
    z_a, z_b = r._buffers("out:mixer_in", 16, [h, z, g, z])[1::2]
    assert z_a.data_ptr() != z_b.data_ptr()
