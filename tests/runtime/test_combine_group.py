"""Composed requests of one step grouped (``hypic.combine_group``): their linear layers run as one conv,
one WY factor and one chain launch per layer, their attention layers rotate all active rows at once.
On CPU through Triton's interpreter (the group reads its pairs by pointer, as on CUDA): three warm
requests in one forward, next to a decode row and a request that reads a segment built in the same
step (not groupable), give every request the logits and pool state of its own standalone combine
(``combine_group_case``). The CUDA run of the same scenario: test_gpu_combine_group.py."""

from __future__ import annotations

from tests.kernels.helpers import run_in_interpreter

SCRIPT = """
import functools
from unittest import mock
import torch
from hypic_agent.kernels import combine_scan, gather_spans
from hypic_agent.kernels.combine_scan import combine_scan_triton as wy
from hypic_agent.runtime.hypic import combine_inputs as ci_mod, splice as splice_mod
from hypic_agent.runtime.hypic.modes import mode_spec
from tests.runtime.combine_group_case import check_grouped_combines
from tests.runtime.conftest import make_model

yes = lambda b, d: True
patches = [mock.patch.object(m, "resolve_triton", yes) for m in (ci_mod, splice_mod, combine_scan, gather_spans)]
patches.append(mock.patch.object(wy, "wy_chain_triton", functools.partial(wy.wy_chain_triton, bv=16, num_warps=2)))
for p in patches:
    p.start()
check_grouped_combines(make_model("qwen3_5_text")[0], mode_spec("hypic"), torch.device("cpu"))
"""


def test_grouped_combines_give_each_request_its_standalone_result():
    run_in_interpreter("combine_group", SCRIPT)
