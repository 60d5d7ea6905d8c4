"""Gated DeltaNet gates: the Triton kernel against its torch twin (interpreter on CPU, CUDA when
present); the twin against the definition."""

from __future__ import annotations

import math

import pytest
import torch

from hypic_agent.kernels.gdn_gates import gdn_gates, gdn_gates_torch
from tests.kernels.helpers import run_in_interpreter


def test_twin_is_the_definition():
    a, b = torch.tensor([[0.5, -30.0]]), torch.tensor([[0.0, 2.0]])
    A_log, dt_bias = torch.tensor([0.0, math.log(2.0)]), torch.tensor([0.25, 0.0])
    g, beta = gdn_gates_torch(a, b, A_log, dt_bias)
    assert g[0, 0].item() == pytest.approx(-math.log1p(math.exp(0.75)))
    assert g[0, 1].item() == pytest.approx(-2.0 * math.log1p(math.exp(-30.0)), rel=1e-4)
    assert beta.tolist()[0] == pytest.approx([0.5, 1 / (1 + math.exp(-2.0))])


def test_gates_refuse_mismatched_shapes():
    with pytest.raises(ValueError, match=r"a, b \[T, HV\]"):
        gdn_gates(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(4), torch.zeros(3))


INTERPRETER = """
import torch
from hypic_agent.kernels.gdn_gates import gdn_gates_torch
from hypic_agent.kernels.gdn_gates.gdn_gates_triton import gdn_gates_triton
g = torch.Generator().manual_seed(0)
for T, HV, dt in ((1, 32, torch.float32), (7, 9, torch.bfloat16), (300, 5, torch.float32)):
    wide = torch.randn(T, 3 * HV + 2, generator=g).to(dt) * 8  # a and b: strided column slices; softplus > 20 too
    a, b = wide[:, 1 : HV + 1], wide[:, HV + 2 : 2 * HV + 2]
    A_log, dt_bias = torch.randn(HV, generator=g), torch.randn(HV, generator=g)
    gt, bt = gdn_gates_triton(a, b, A_log, dt_bias)
    gr, br = gdn_gates_torch(a, b, A_log, dt_bias)
    assert gt.dtype == torch.float32 and bt.dtype == dt
    assert (gt - gr).abs().max() <= 1e-5 * (1 + gr.abs().max()), (T, HV, (gt - gr).abs().max())
    assert (bt.float() - br.float()).abs().max() <= (1e-6 if dt == torch.float32 else 8e-3), (T, HV)
"""


def test_triton_gates_match_the_twin_in_the_interpreter():
    run_in_interpreter("gdn_gates", INTERPRETER)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_gates_match_the_twin():
    g = torch.Generator().manual_seed(1)
    a, b = (torch.randn(64, 32, generator=g) * 8).cuda().bfloat16(), torch.randn(64, 32, generator=g).cuda().bfloat16()
    A_log, dt_bias = torch.randn(32, generator=g).cuda(), torch.randn(32, generator=g).cuda()
    gt, bt = gdn_gates(a, b, A_log, dt_bias)
    gr, br = gdn_gates_torch(a, b, A_log, dt_bias)
    torch.testing.assert_close(gt, gr, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(bt, br)
