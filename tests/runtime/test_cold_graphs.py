"""Cold-core CUDA graphs (``runtime.runner.cold_graphs``): layout keys and sighting counts here;
capture and replay against eager on the H200 (``gpu`` marker)."""

from __future__ import annotations

import itertools

import pytest
import torch

from hypic_agent.config import Settings
from hypic_agent.kernels.config import DEFAULT_KERNELS
from hypic_agent.runtime.hypic.build import ColdBatch, build_entries
from hypic_agent.runtime.hypic.combine import combine
from hypic_agent.runtime.hypic.layout import plan_layout
from hypic_agent.runtime.hypic.modes import mode_spec
from hypic_agent.runtime.runner.cold_graphs import ColdGraphs
from hypic_agent.runtime.runner.graph_set import GraphSet
from hypic_agent.runtime.runner.stage_graphs import LayerGraphs

from .conftest import make_model, rand_tokens


def _request(model, warm, segs, cold_segs, seams, suffix, dev, graphs: GraphSet | None = None):
    """A composed request: ``warm`` entries for ``segs``' first ones, ``cold_segs`` built in the forward;
    ``graphs``: the runner's graphs it may replay (None: eager)."""
    batch = ColdBatch(model, cold_segs, seams[len(warm) :], graphs=graphs.colds if graphs is not None else None)
    entries = [*warm, *batch.entries]
    lay = plan_layout([*segs, *cold_segs], entries, seams, suffix, dev)
    return combine(model, lay, entries, mode_spec("hypic"), cold=batch, graphs=graphs), batch


def test_layout_key_and_sightings():
    model, _, _ = make_model("qwen3_5_text")
    a = ColdBatch(model, [rand_tokens(20, 1), rand_tokens(9, 2)], [4, 4])
    b = ColdBatch(model, [rand_tokens(20, 3), rand_tokens(9, 4)], [4, 4])
    c = ColdBatch(model, [rand_tokens(20, 3), rand_tokens(9, 4)], [4, 0])
    assert a.layout_key == b.layout_key != c.layout_key and a.serial != b.serial
    assert set(a.prep_ms) == {"cold_tables_ms", "cold_split_ms", "cold_entries_ms", "cold_sinks_ms"}
    r = ColdGraphs(capture_after=2)
    assert r._sighting(a.layout_key, a.serial) == 1
    assert r._sighting(a.layout_key, a.serial) == 1  # one batch counts once, whatever its layers
    assert r._sighting(b.layout_key, b.serial) == 2
    # a runner's cold graphs: none with ``cold_graph_after`` 0 (and no graph at all off CUDA); nothing
    # is parked on the model
    cuda = torch.device("cuda")  # GraphSet.of only constructs its parts: no device is touched
    assert GraphSet.of(model, Settings(cold_graph_after=0), DEFAULT_KERNELS, cuda).colds is None
    on = GraphSet.of(model, Settings(cold_graph_after=3, cold_graphs_max=5), DEFAULT_KERNELS, cuda).colds
    assert isinstance(on, ColdGraphs) and (on.capture_after, on.max_layouts) == (3, 5)
    assert GraphSet.of(model, Settings(), DEFAULT_KERNELS, torch.device("cpu")) == GraphSet()
    assert not hasattr(model, "cold_graphs")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    "arch,dtype,tol", [("qwen3_5_text", torch.float32, 2e-2), ("qwen3_5_moe_text", torch.bfloat16, 5e-2)]
)
def test_cold_core_replays_match_eager(arch, dtype, tol):
    """Requests whose cold batches share one layout (other documents each time): from the second the
    linear layers' cold core is captured, from the third replayed; logits, layer states and the
    built entries match the same requests run eagerly."""
    model, _, _ = make_model(arch)
    model = model.to("cuda", dtype)
    dev = torch.device("cuda")
    segs = [tuple(rand_tokens(70, 11)), tuple(rand_tokens(33, 12))]
    seams = [8] * 5
    warm = build_entries(model, segs, seams[:2])
    colds = [[tuple(rand_tokens(n, 100 * j + n)) for n in (90, 64, 41)] for j in range(4)]
    suffixes = [rand_tokens(12, 50 + j) for j in range(4)]
    ref = [_request(model, warm, segs, c, seams, s, dev) for c, s in zip(colds, suffixes, strict=True)]
    runner = ColdGraphs(capture_after=2)
    graphs = GraphSet(stages=LayerGraphs(model), colds=runner)  # the stage buffers keep the core's inputs in place
    got = [_request(model, warm, segs, c, seams, s, dev, graphs) for c, s in zip(colds, suffixes, strict=True)]
    assert runner.disabled is None, runner.disabled
    n_lin = sum(layer.linear_attn is not None for layer in model.layers)
    assert runner.replays == 2 * n_lin  # eager, capture, then two replayed requests

    def close(a: torch.Tensor, b: torch.Tensor) -> None:
        scale = max(a.float().abs().max().item(), 1.0)
        assert a.shape == b.shape and (a.float() - b.float()).abs().max().item() < tol * scale

    for (rs, rb), (gs, gb) in zip(ref, got, strict=True):
        close(rs.last_logits, gs.last_logits)
        for la, lb in zip(rs.layers, gs.layers, strict=True):
            for ta, tb in zip(vars(la).values(), vars(lb).values(), strict=True):
                close(ta, tb)
        for ea, eb in zip(rb.entries, gb.entries, strict=True):
            for la, lb in zip(ea.layers, eb.layers, strict=True):
                for ta, tb in zip(vars(la).values(), vars(lb).values(), strict=True):
                    close(ta, tb)


def test_carved_entry_tensors_are_aligned_disjoint_views():
    """On CUDA a cold entry's tensors are views of one allocation per dtype (forced here on CPU):
    each 256-byte aligned, none overlapping, shaped as asked."""
    from hypic_agent.runtime.hypic.build import _carve

    shapes = [(3, 5, 5), (3, 5, 7), (10, 3), (3, 5, 5), (0, 2, 4), (17, 2, 4), (3, 5, 7), (3, 5, 5)]
    for dt in (torch.float32, torch.bfloat16):
        ts = _carve(shapes, dt, torch.device("cpu"), one_block=True)
        assert [tuple(t.shape) for t in ts] == shapes and all(t.is_contiguous() and t.dtype == dt for t in ts)
        base = {t.untyped_storage().data_ptr() for t in ts}
        offsets = [t.storage_offset() * t.element_size() for t in ts]
        assert len(base) == 1 and all(o % 256 == 0 for o in offsets)  # CUDA blocks are 512-byte aligned
        spans = sorted((t.data_ptr(), t.data_ptr() + t.nbytes) for t in ts if t.numel())
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
        for i, t in enumerate(ts):
            t.fill_(i)
        assert all(bool((t == i).all()) for i, t in enumerate(ts))
    assert len({t.untyped_storage().data_ptr() for t in _carve(shapes, torch.float32, torch.device("cpu"))}) == 8


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_carved_cold_entries_round_trip_every_store_tier(tmp_path):
    """Cold entries built on CUDA hold views of two allocations (pairs, the rest): the store moves them down to
    pinned host memory and to disk (safetensors) and back unchanged."""
    pytest.importorskip("sqlalchemy")  # the store's registry (not on every GPU image)
    from tests.segments.helpers import make_store, meta

    model, _, _ = make_model("qwen3_5_text")
    model = model.to("cuda")
    batch = ColdBatch(model, [rand_tokens(40, 1), rand_tokens(23, 2)], [8, 8])
    combine(
        model, plan_layout([tuple(rand_tokens(40, 1)), tuple(rand_tokens(23, 2))], list(batch.entries), [8, 8],
                           rand_tokens(5, 3), torch.device("cuda")),
        list(batch.entries), mode_spec("hypic"), cold=batch,
    )  # fmt: skip
    payloads = [e.to_tensors() for e in batch.entries]

    def blocks(names: tuple[str, ...]) -> set[int]:
        return {t.untyped_storage().data_ptr() for n, t in payloads[0].items() if n.split(".")[-1] in names}

    assert len(blocks(("T", "S"))) == 1 and len(blocks(("conv", "k", "v"))) == 1  # the pairs' block, the rest's
    assert blocks(("T", "S")) != blocks(("conv", "k", "v"))
    nbytes = sum(t.nbytes for t in payloads[0].values())
    s = make_store(tmp_path, gpu_device="auto", gpu_budget_bytes=nbytes + 1024, cpu_budget_bytes=nbytes + 1024,
                   disk_budget_bytes=1 << 30)  # fmt: skip
    keys = [f"{i:032x}" for i in range(3)]
    for k, p in zip(keys, [*payloads, payloads[0]], strict=True):  # the third pushes the first to disk
        s.put(k, p, meta())
    for k, p in zip(keys, [*payloads, payloads[0]], strict=True):
        got, tier = s.get(k)
        assert got.keys() == p.keys() and all(torch.equal(got[n].cpu(), p[n].cpu()) for n in p), tier
