"""GPU: several warm composed requests in one step run their linear layers as one group
(``hypic.combine_group``: one conv, one factor and one chain launch per layer for all of them); every
request gets the logits and pool state it gets from its own standalone combine (fp32, 1e-4), next to
a decode row and a request that cannot join the group (one of its segments is built in the step)."""

from __future__ import annotations

import pytest
import torch

from hypic_agent.runtime.hypic.build import ColdBatch, build_entries
from hypic_agent.runtime.hypic.combine import combine
from hypic_agent.runtime.hypic.combine_group import CombineGroup, group_works
from hypic_agent.runtime.hypic.combine_inputs import combine_inputs
from hypic_agent.runtime.hypic.combine_work import CombineWork
from hypic_agent.runtime.hypic.layout import plan_layout
from hypic_agent.runtime.hypic.modes import mode_spec, seam_tokens
from hypic_agent.runtime.runner.destination import StateDestination
from hypic_agent.runtime.runner.plan import plan_forward
from hypic_agent.runtime.runner.pool import StatePool
from hypic_agent.runtime.runner.runner import ModelRunner

from .conftest import make_model, rand_tokens

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
CUDA = torch.device("cuda")
TOL = dict(rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", ["hypic", "transition", "addition"])
def test_grouped_combines_give_each_request_its_standalone_result(mode):
    model, _, _ = make_model("qwen3_5_text")
    model = model.to(CUDA, torch.float32)
    spec = mode_spec(mode)
    w = 4.0 if spec.seams else 0.0
    pool = StatePool(model.config, slots=8, kv_tokens=2048, page_size=16, device=CUDA, dtype=torch.float32)
    runner = ModelRunner(model, pool)
    dec_prompt, dec_token = rand_tokens(13, 1), rand_tokens(1, 2)[0]
    dec = pool.alloc(32)
    assert dec is not None
    runner.forward(plan_forward(pool, [dec], [dec_prompt]))

    docs = [tuple(rand_tokens(n, 100 + i)) for i, n in enumerate((21, 17, 30, 12, 25))]
    cached = dict(zip(docs, build_entries(model, docs, [seam_tokens(w, len(s)) for s in docs]), strict=True))
    cold_doc = tuple(rand_tokens(19, 200))
    cold = ColdBatch(model, [cold_doc], [seam_tokens(w, len(cold_doc))])
    by_tokens = cached | {cold_doc: cold.entries[0]}
    # three warm requests (other orders, other suffix lengths), then one reading the step's cold build
    reqs = [
        ([docs[0], docs[1], docs[2]], rand_tokens(5, 80)),
        ([docs[3], docs[0]], rand_tokens(9, 81)),
        ([docs[2], docs[4], docs[1], docs[3]], rand_tokens(3, 82)),
        ([docs[4], cold_doc], rand_tokens(6, 83)),
    ]
    works, seqs, lays = [], [], []
    for segs, suffix in reqs:
        entries = [by_tokens[s] for s in segs]
        lay = plan_layout(segs, entries, [seam_tokens(w, len(s)) for s in segs], suffix, CUDA)
        seq = pool.alloc(lay.total + 4)
        assert seq is not None
        seqs.append(seq)
        lays.append((segs, entries, suffix))

        def inputs(lay=lay, entries=entries):
            return combine_inputs(model, lay, entries, spec.transition, None, cold.entries)

        works.append(CombineWork(lay, entries, spec, inputs, StateDestination.of(pool, seq, lay.total)))
    logits = runner.forward(runner.plan([dec], [[dec_token]], works, [cold]))
    assert logits.shape[0] == 1 + len(reqs)

    units = group_works(works)  # planned by the forward: the grouping it ran
    assert isinstance(units[0], CombineGroup) and units[0].works == works[:3], units
    assert units[1] is works[3]  # reads an entry built in the step: alone
    for k, ((segs, entries, suffix), seq, work) in enumerate(zip(lays, seqs, works, strict=True)):
        ref = combine(model, plan_layout(segs, entries, [seam_tokens(w, len(s)) for s in segs], suffix, CUDA),
                      entries, spec)  # fmt: skip
        torch.testing.assert_close(logits[1 + k], ref.last_logits, **TOL)
        assert work.into is not None
        work.into.commit(work.state(logits[1 + k]))
        got = pool.export(seq)
        for mine, theirs in zip(got.layers, ref.layers, strict=True):
            for x, y in zip(vars(mine).values(), vars(theirs).values(), strict=True):
                torch.testing.assert_close(x.float(), y.float(), **TOL)
