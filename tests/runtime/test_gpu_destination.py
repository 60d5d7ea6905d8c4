"""GPU (H200, never in CI): a combine written straight into the state pool on CUDA, eager and from a
combine CUDA graph (whose outputs are copied into the pool instead of cloned), equals the standalone
state loaded with ``StatePool.load``; contiguous pages (K/V assembled in place) and a fragmented pool."""

from __future__ import annotations

import pytest
import torch

from hypic_agent.runtime.hypic.build import build_entries
from hypic_agent.runtime.hypic.combine import combine
from hypic_agent.runtime.hypic.layout import plan_layout
from hypic_agent.runtime.hypic.modes import mode_spec
from hypic_agent.runtime.runner.combine_graphs import CombineGraphs
from hypic_agent.runtime.runner.destination import StateDestination
from hypic_agent.runtime.runner.graph_set import GraphSet
from hypic_agent.runtime.runner.pool import StatePool
from hypic_agent.runtime.runner.stage_graphs import LayerGraphs

from .conftest import make_model, rand_tokens
from .test_destination import _fragment  # holds every page, frees every other one

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("fragmented", [False, True])
@pytest.mark.parametrize("graphs", [False, True])
def test_combine_into_the_pool_on_cuda_equals_load(graphs, fragmented):
    model, _, _ = make_model("qwen3_5_moe_text")
    model = model.to("cuda", torch.bfloat16)
    dev = torch.device("cuda")
    seam = 6
    segs = [tuple(rand_tokens(40, 300 + i)) for i in range(5)]
    entries = build_entries(model, segs, [seam] * len(segs))
    orders = [[0, 1, 2], [3, 1, 4], [4, 0, 2], [2, 3, 1]]
    requests = []
    for j, order in enumerate(orders):
        es = [entries[i] for i in order]
        requests.append((plan_layout([segs[i] for i in order], es, [seam] * 3, rand_tokens(7, 60 + j), dev), es))
    spec = mode_spec("hypic")
    refs = [combine(model, lay, es, spec) for lay, es in requests]  # eager, standalone
    runner = CombineGraphs(model, capture_after=1) if graphs else None
    gs = GraphSet(stages=LayerGraphs(model), combines=runner) if graphs else None  # None: eager
    kw = dict(slots=140 if fragmented else 4, kv_tokens=1024, page_size=8, device=dev, dtype=torch.bfloat16)
    pool, ref_pool = StatePool(model.config, **kw), StatePool(model.config, **kw)  # type: ignore[arg-type]
    if fragmented:
        _fragment(pool)  # freed request pages stay scattered: the pool stays fragmented
    for (lay, es), ref in zip(requests, refs, strict=True):
        seq, ref_seq = pool.alloc(lay.total + 4), ref_pool.alloc(lay.total + 4)
        assert seq is not None and ref_seq is not None
        into = StateDestination.of(pool, seq, lay.total)
        assert (into.first is None) == fragmented
        got = combine(model, lay, es, spec, into=into, graphs=gs)
        assert got.layers == []
        into.commit(got)
        ref_pool.load(ref_seq, ref)
        scale = ref.last_logits.abs().max().item()
        assert (ref.last_logits - got.last_logits).abs().max().item() < 2e-2 * scale
        mine, theirs = pool.export(seq), ref_pool.export(ref_seq)
        for a, b in zip(mine.layers, theirs.layers, strict=True):
            for x, y in zip(vars(a).values(), vars(b).values(), strict=True):
                assert x.float().abs().sum() > 0
                tol = 5e-2 * max(y.float().abs().max().item(), 1e-6)
                assert (x.float() - y.float()).abs().max().item() < tol
        pool.free(seq)
        ref_pool.free(ref_seq)
    if runner is not None:
        assert runner.disabled is None, runner.disabled
        assert runner.replays >= 2  # eager, capture, then replays wrote into the pool
