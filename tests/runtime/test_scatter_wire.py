"""The scatter workers' wire format and streamed build, in one process: layer groups, jobs,
per-dtype buffers, and the build that hands each layer group out as soon as it is final."""

from __future__ import annotations

import torch

from hypic_agent.runtime.hypic.build import build_entries
from hypic_agent.runtime.workers.protocol import (
    Job,
    decode_meta,
    encode_meta,
    entry_tensors,
    flat_layout,
    layer_groups,
    layer_tensors,
    pack,
    unpack,
)
from hypic_agent.runtime.workers.stream import build_streamed

from .conftest import make_model, rand_tokens


def test_layer_groups_and_jobs_on_the_wire():
    assert layer_groups(4, 0) == layer_groups(4, 4) == layer_groups(4, 9) == [(0, 4)]
    assert layer_groups(4, 1) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert layer_groups(5, 2) == [(0, 2), (2, 4), (4, 5)]
    job = Job(7, [(1, 2, 3), (4, 5)], [1, 0], torch.bfloat16, stream_layers=2)
    hdr, body = job.encode()
    assert Job.body_len(hdr) == body.numel() == 2 + 2 * 2 + 5
    assert Job.decode(hdr, body) == job
    ctx = Job(8, [(1, 2, 3), (4, 5)], [1, 0], torch.float32, prefix=(9, 8, 7, 6))  # a build context
    hdr, body = ctx.encode()
    assert Job.body_len(hdr) == body.numel() == 2 + 2 * 2 + 4 + 5
    back = Job.decode(hdr, body)
    assert back == ctx and back.prefix == (9, 8, 7, 6) and back.segments == [(1, 2, 3), (4, 5)]


def test_a_streamed_build_hands_out_each_layer_group_finished():
    """``build_streamed`` emits each group once its layers are final (a copy taken then equals the
    finished entries), in order, and builds exactly ``build_entries``'s entries."""
    model, _, _ = make_model("qwen3_5_text")
    segs = [tuple(rand_tokens(n, 3300 + i)) for i, n in enumerate([30, 17, 44])]
    seams = [8, 4, 8]
    groups = layer_groups(len(model.layers), 3)
    seen: list[tuple[int, int, int]] = []
    copies: list[list[torch.Tensor]] = []

    def emit(g, start, end, entries):
        seen.append((g, start, end))
        copies.append([t.clone() for e in entries for t in layer_tensors(e, start, end)])

    got = build_streamed(model, segs, seams, groups, emit)
    assert seen == [(0, 0, 3), (1, 3, 4)]
    for (_, start, end), early in zip(seen, copies, strict=True):
        final = [t for e in got for t in layer_tensors(e, start, end)]
        assert all(torch.equal(a, b) for a, b in zip(early, final, strict=True))
    ref = build_entries(model, segs, seams)
    for a, b in zip(got, ref, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(entry_tensors(a), entry_tensors(b), strict=True))


def test_an_entry_travels_as_one_buffer_per_dtype_and_comes_back_whole():
    ts = [torch.randn(2, 3), torch.randn(4).to(torch.bfloat16), torch.randn(5, 1, 2), torch.randn(3).to(torch.bfloat16)]
    meta = decode_meta(encode_meta(ts))
    assert meta == [(t.dtype, tuple(t.shape)) for t in ts]
    flats = pack(ts)
    assert [(f.dtype, f.numel()) for f in flats] == flat_layout(meta) == [(torch.float32, 16), (torch.bfloat16, 7)]
    for separate in (False, True):
        back = unpack(flats, meta, separate=separate)
        assert all(torch.equal(a, b) for a, b in zip(back, ts, strict=True))
        shared = back[0].untyped_storage().data_ptr() == back[2].untyped_storage().data_ptr()
        assert shared != separate  # views of the buffer, or each tensor its own storage (CPU tiers)
