"""One ``ForwardPlan`` mixing every kind of row: a decode row, a prefill chunk, two composed requests'
combines (each with a cold segment built in the same forward, one of them shared) and a cold build
of its own, through the runner's one layer loop. Every request gets the logits and state it gets
alone (fp32, 1e-4), in every composed mode and on every linear-layer kind."""

from __future__ import annotations

import pytest
import torch

from hypic_agent.runtime.hypic.build import ColdBatch, build_entries
from hypic_agent.runtime.hypic.combine import combine
from hypic_agent.runtime.hypic.combine_inputs import combine_inputs
from hypic_agent.runtime.hypic.combine_work import CombineWork
from hypic_agent.runtime.hypic.layout import plan_layout
from hypic_agent.runtime.hypic.modes import mode_spec, seam_tokens
from hypic_agent.runtime.runner.destination import StateDestination
from hypic_agent.runtime.runner.plan import plan_forward
from hypic_agent.runtime.runner.pool import StatePool
from hypic_agent.runtime.runner.runner import ModelRunner

from .conftest import make_model, rand_tokens
from .reference import decode_step, prefill

CPU = torch.device("cpu")
TOL = dict(rtol=1e-4, atol=1e-4)


def _segs(seed: int, lengths: tuple[int, ...]) -> list[tuple[int, ...]]:
    return [tuple(rand_tokens(n, seed + i)) for i, n in enumerate(lengths)]


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a.float(), b.float(), **TOL)


@pytest.mark.parametrize("mode", ["hypic", "transition_rope", "transition", "addition"])
@pytest.mark.parametrize("arch", ["qwen3_5_text", "granitemoehybrid", "kimi_linear", "falcon_h1"])
def test_one_step_mixing_every_row_kind_gives_each_request_its_alone_result(arch, mode):
    model, _, _ = make_model(arch)
    spec = mode_spec(mode)
    w = 4.0 if spec.seams else 0.0
    pool = StatePool(model.config, slots=6, kv_tokens=1024, page_size=8, device=CPU, dtype=torch.float32)
    runner = ModelRunner(model, pool)

    # a request that decodes (prefilled before the step) and one whose first chunk runs in the step
    dec_prompt, dec_token = rand_tokens(13, 1), rand_tokens(1, 2)[0]
    chunk = rand_tokens(11, 3)
    dec = pool.alloc(32)
    pre = pool.alloc(32)
    assert dec is not None and pre is not None
    runner.forward(plan_forward(pool, [dec], [dec_prompt]))

    # two composed requests: a cached document each, plus cold documents built in the same forward
    shared_cold = _segs(50, (19,))[0]
    hits = _segs(60, (21, 17))
    req = [
        ([hits[0], shared_cold, _segs(70, (15,))[0]], rand_tokens(5, 80)),
        ([shared_cold, hits[1]], rand_tokens(6, 81)),
    ]
    seams = [[seam_tokens(w, len(s)) for s in segs] for segs, _ in req]
    cached = {s: e for s, e in zip(hits, build_entries(model, hits, [seam_tokens(w, len(s)) for s in hits]))}
    lonely = _segs(90, (23, 9))  # a cold build of a request that does not combine in this step
    cold_segs = [shared_cold, req[0][0][2], *lonely]
    cold = ColdBatch(model, cold_segs, [seam_tokens(w, len(s)) for s in cold_segs])
    by_tokens = dict(zip(cold_segs, cold.entries, strict=True)) | cached

    works, seqs = [], []
    for (segs, suffix), sm in zip(req, seams, strict=True):
        entries = [by_tokens[s] for s in segs]
        lay = plan_layout(segs, entries, sm, suffix, CPU)
        seq = pool.alloc(lay.total + 4)
        assert seq is not None
        seqs.append(seq)

        def inputs(lay=lay, entries=entries):  # planned at layer 0, as the scheduler does
            return combine_inputs(model, lay, entries, spec.transition, None, cold.entries)

        works.append(CombineWork(lay, entries, spec, inputs, StateDestination.of(pool, seq, lay.total)))
    plan = runner.plan([dec, pre], [[dec_token], chunk], works, [cold])
    assert plan.n_rows == cold.n_tokens + 1 + len(chunk) + sum(x.n_rows for x in works)
    logits = runner.forward(plan)
    assert logits.shape[0] == 4

    # alone: the decode row and the chunk through the reference forward
    ref_dec = prefill(model, [dec_prompt])[0]
    decode_step(model, [ref_dec], [dec_token])
    _close(logits[0], ref_dec.last_logits)
    _close(logits[1], prefill(model, [chunk])[0].last_logits)
    # alone: each cold entry equals its isolated build
    for seg, entry in zip(cold_segs, cold.entries, strict=True):
        (alone,) = build_entries(model, [seg], [seam_tokens(w, len(seg))])
        for mine, theirs in zip(entry.layers, alone.layers, strict=True):
            for x, y in zip(vars(mine).values(), vars(theirs).values(), strict=True):
                _close(x, y)
    # alone: each combine equals the standalone combine over the same entries, logits and pool state
    for k, ((segs, suffix), sm, seq, work) in enumerate(zip(req, seams, seqs, works, strict=True)):
        entries = [by_tokens[s] for s in segs]
        ref = combine(model, plan_layout(segs, entries, sm, suffix, CPU), entries, spec)
        _close(logits[2 + k], ref.last_logits)
        work.into.commit(work.state(logits[2 + k]))
        got = pool.export(seq)
        assert got.length == ref.length
        for mine, theirs in zip(got.layers, ref.layers, strict=True):
            for x, y in zip(vars(mine).values(), vars(theirs).values(), strict=True):
                _close(x, y)


def test_plan_without_pool_rows_needs_work_and_refuses_empty():
    with pytest.raises(ValueError, match="empty forward plan"):
        plan_forward(None, [], [])


def test_pool_rows_are_the_plans_ids_even_without_sequence_objects():
    """The decode graphs' static plans carry no ``PoolSeq``s (``seqs=()``), only the rows' tensors: the
    layer loop must run them as pool rows."""
    import dataclasses

    model, _, _ = make_model("qwen3_5_text")
    pool = StatePool(model.config, slots=2, kv_tokens=64, page_size=8, device=CPU, dtype=torch.float32)
    runner = ModelRunner(model, pool)
    seq = pool.alloc(16)
    assert seq is not None
    prompt = rand_tokens(9, 5)
    runner.forward(plan_forward(pool, [seq], [prompt]))
    plan = plan_forward(pool, [seq], [[7]], paged=True)
    bare = dataclasses.replace(plan, seqs=(), new_tokens=())
    ref = prefill(model, [prompt])[0]
    decode_step(model, [ref], [7])
    _close(runner.layers(bare)[0], ref.last_logits)


def test_a_lone_combine_goes_through_the_combine_graphs_path_and_matches_the_loop(monkeypatch):
    """A step of one combine and nothing else is handed to ``combine`` with the runner's graphs (a CUDA
    graph replays it on a GPU; on the CPU it runs eagerly): same logits and pool state as the loop."""
    from hypic_agent.runtime.runner import runner as runner_module
    from hypic_agent.runtime.runner.combine_graphs import CombineGraphs
    from hypic_agent.runtime.runner.graph_set import GraphSet

    handed: list[GraphSet] = []  # the graphs of each call of ``combine`` by the runner

    def spy(*args, **kwargs):
        handed.append(kwargs["graphs"])
        return combine(*args, **kwargs)

    monkeypatch.setattr(runner_module, "combine", spy)

    model, _, _ = make_model("qwen3_5_text")
    spec = mode_spec("hypic")
    segs, suffix = _segs(40, (21, 18)), rand_tokens(5, 41)
    seams = [seam_tokens(4.0, len(s)) for s in segs]
    entries = build_entries(model, segs, seams)
    results = []
    for graphs in (GraphSet(), GraphSet(combines=CombineGraphs(model))):
        pool = StatePool(model.config, slots=2, kv_tokens=128, page_size=8, device=CPU, dtype=torch.float32)
        runner = ModelRunner(model, pool, graphs=graphs)
        lay = plan_layout(segs, list(entries), seams, suffix, CPU)
        seq = pool.alloc(lay.total)
        assert seq is not None
        work = CombineWork(
            lay,
            list(entries),
            spec,
            combine_inputs(model, lay, list(entries), True),
            StateDestination.of(pool, seq, lay.total),
        )
        handed.clear()
        logits = runner.forward(runner.plan([], [], [work]))
        # with combine graphs the lone combine goes to ``combine`` with them; without, to the layer loop
        assert len(handed) == (graphs.combines is not None) and all(g is graphs for g in handed)
        work.into.commit(work.state(logits[0]))
        results.append((logits[0], pool.export(seq)))
    (a, sa), (b, sb) = results
    _close(a, b)
    for x, y in zip(sa.layers, sb.layers, strict=True):
        for u, v in zip(vars(x).values(), vars(y).values(), strict=True):
            _close(u, v)
