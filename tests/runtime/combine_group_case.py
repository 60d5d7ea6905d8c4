"""The scenario both combine-group tests run (CPU through Triton's interpreter: test_combine_group.py;
CUDA: test_gpu_combine_group.py): three warm composed requests in one forward, next to a decode row and a
request reading a segment built in the same step (not groupable), each checked against its own
standalone combine (logits and pool state, 1e-4)."""

from __future__ import annotations

import functools

import torch

from hypic_agent.runtime.hypic.build import ColdBatch, build_entries
from hypic_agent.runtime.hypic.combine import combine
from hypic_agent.runtime.hypic.combine_group import CombineGroup, group_works
from hypic_agent.runtime.hypic.combine_inputs import combine_inputs
from hypic_agent.runtime.hypic.combine_work import CombineWork
from hypic_agent.runtime.hypic.layout import plan_layout
from hypic_agent.runtime.hypic.modes import ModeSpec, seam_tokens
from hypic_agent.runtime.models.hybrid import HybridForCausalLM
from hypic_agent.runtime.runner.destination import StateDestination
from hypic_agent.runtime.runner.plan import plan_forward
from hypic_agent.runtime.runner.pool import StatePool
from hypic_agent.runtime.runner.runner import ModelRunner
from tests.runtime.conftest import rand_tokens

TOL = dict(rtol=1e-4, atol=1e-4)


def check_grouped_combines(model: HybridForCausalLM, spec: ModeSpec, device: torch.device) -> None:
    w = 4.0 if spec.seams else 0.0
    pool = StatePool(model.config, slots=8, kv_tokens=2048, page_size=16, device=device, dtype=torch.float32)
    runner = ModelRunner(model, pool)
    dec = pool.alloc(32)
    assert dec is not None
    runner.forward(plan_forward(pool, [dec], [rand_tokens(13, 1)]))

    docs = [tuple(rand_tokens(n, 100 + i)) for i, n in enumerate((21, 17, 30, 12, 25))]
    by_tokens = dict(zip(docs, build_entries(model, docs, [seam_tokens(w, len(s)) for s in docs]), strict=True))
    cold_doc = tuple(rand_tokens(19, 200))
    cold = ColdBatch(model, [cold_doc], [seam_tokens(w, len(cold_doc))])
    by_tokens[cold_doc] = cold.entries[0]
    # three warm requests (other orders, other suffix lengths), then one reading the step's cold build
    reqs = [
        ([docs[0], docs[1], docs[2]], rand_tokens(5, 80)),
        ([docs[3], docs[0]], rand_tokens(9, 81)),
        ([docs[2], docs[4], docs[1], docs[3]], rand_tokens(3, 82)),
        ([docs[4], cold_doc], rand_tokens(6, 83)),
    ]
    works, seqs, args = [], [], []
    for segs, suffix in reqs:
        entries = [by_tokens[s] for s in segs]
        seams = [seam_tokens(w, len(s)) for s in segs]
        lay = plan_layout(segs, entries, seams, suffix, device)
        seq = pool.alloc(lay.total + 4)
        assert seq is not None
        seqs.append(seq)
        args.append((segs, entries, seams, suffix))
        inputs = functools.partial(combine_inputs, model, lay, entries, spec.transition, None, cold.entries)
        works.append(CombineWork(lay, entries, spec, inputs, StateDestination.of(pool, seq, lay.total)))
    logits = runner.forward(runner.plan([dec], [rand_tokens(1, 2)], works, [cold]))
    assert logits.shape[0] == 1 + len(reqs)

    units = group_works(works)  # planned by the forward: the grouping it ran
    assert isinstance(units[0], CombineGroup) and units[0].works == works[:3], units
    assert units[1] is works[3]  # reads an entry built in the step: alone
    for k, ((segs, entries, seams, suffix), seq, work) in enumerate(zip(args, seqs, works, strict=True)):
        ref = combine(model, plan_layout(segs, entries, seams, suffix, device), entries, spec)
        assert ref.last_logits is not None
        torch.testing.assert_close(logits[1 + k], ref.last_logits, **TOL)
        assert work.into is not None
        work.into.commit(work.state(logits[1 + k]))
        got = pool.export(seq)
        for mine, theirs in zip(got.layers, ref.layers, strict=True):
            for x, y in zip(vars(mine).values(), vars(theirs).values(), strict=True):
                torch.testing.assert_close(x.float(), y.float(), **TOL)
