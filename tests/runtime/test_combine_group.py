"""Composed requests of one step grouped (``hypic.combine_group``): their linear layers run as one conv,
one WY factor and one chain launch per layer, their attention layers rotate all active rows at once.
On CPU through Triton's interpreter (the group reads its pairs by pointer, as on CUDA): three warm
requests in one forward, next to a decode row and a request that reads a segment built in the same
step (not groupable), give every request the logits and pool state of its own standalone combine.
The CUDA run of the same property: test_gpu_combine_group.py."""

from __future__ import annotations

from tests.kernels.helpers import run_in_interpreter

SCRIPT = """
import functools
from unittest import mock
import torch
from hypic_agent.kernels import combine_scan, gather_spans
from hypic_agent.kernels.combine_scan import combine_scan_triton as wy
from hypic_agent.runtime.hypic import combine_inputs as ci_mod, splice as splice_mod
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
from tests.runtime.conftest import make_model, rand_tokens

CPU = torch.device("cpu")
yes = lambda b, d: True
patches = [mock.patch.object(m, "resolve_triton", yes) for m in (ci_mod, splice_mod, combine_scan, gather_spans)]
patches.append(mock.patch.object(wy, "wy_chain_triton", functools.partial(wy.wy_chain_triton, bv=16, num_warps=2)))
for p in patches:
    p.start()
model, _, _ = make_model("qwen3_5_text")
spec = mode_spec("hypic")
pool = StatePool(model.config, slots=8, kv_tokens=1024, page_size=8, device=CPU, dtype=torch.float32)
runner = ModelRunner(model, pool)
dec = pool.alloc(32)
runner.forward(plan_forward(pool, [dec], [rand_tokens(13, 1)]))
docs = [tuple(rand_tokens(n, 100 + i)) for i, n in enumerate((21, 17, 30, 12, 25))]
by_tokens = dict(zip(docs, build_entries(model, docs, [seam_tokens(4.0, len(s)) for s in docs])))
cold_doc = tuple(rand_tokens(19, 200))
cold = ColdBatch(model, [cold_doc], [seam_tokens(4.0, len(cold_doc))])
by_tokens[cold_doc] = cold.entries[0]
reqs = [
    ([docs[0], docs[1], docs[2]], rand_tokens(5, 80)),
    ([docs[3], docs[0]], rand_tokens(9, 81)),
    ([docs[2], docs[4], docs[1], docs[3]], rand_tokens(3, 82)),
    ([docs[4], cold_doc], rand_tokens(6, 83)),
]
works, seqs, args = [], [], []
for segs, suffix in reqs:
    entries = [by_tokens[s] for s in segs]
    seams = [seam_tokens(4.0, len(s)) for s in segs]
    lay = plan_layout(segs, entries, seams, suffix, CPU)
    seq = pool.alloc(lay.total + 4)
    seqs.append(seq)
    args.append((segs, entries, seams, suffix))
    inputs = functools.partial(combine_inputs, model, lay, entries, spec.transition, None, cold.entries)
    works.append(CombineWork(lay, entries, spec, inputs, StateDestination.of(pool, seq, lay.total)))
logits = runner.forward(runner.plan([dec], [rand_tokens(1, 2)], works, [cold]))
units = group_works(works)
assert isinstance(units[0], CombineGroup) and units[0].works == works[:3], units
assert units[1] is works[3]
for k, ((segs, entries, seams, suffix), seq, work) in enumerate(zip(args, seqs, works)):
    ref = combine(model, plan_layout(segs, entries, seams, suffix, CPU), entries, spec)
    torch.testing.assert_close(logits[1 + k], ref.last_logits, rtol=1e-4, atol=1e-4)
    work.into.commit(work.state(logits[1 + k]))
    got = pool.export(seq)
    for mine, theirs in zip(got.layers, ref.layers):
        for x, y in zip(vars(mine).values(), vars(theirs).values()):
            torch.testing.assert_close(x.float(), y.float(), rtol=1e-4, atol=1e-4)
"""


def test_grouped_combines_give_each_request_its_standalone_result():
    run_in_interpreter("combine_group", SCRIPT)
