"""Fused combine scan: the torch twin equals one pass over the stream; tables and bad chains.
The Triton kernel against the twin: test_triton_interpreter.py (CPU) and test_gpu_gdn.py (CUDA)."""

from __future__ import annotations

import pytest
import torch

from hypic_agent.kernels.combine_scan import Body, Piece, chain_tables, gdn_combine_scan
from hypic_agent.kernels.gdn import gated_delta_rule
from hypic_agent.kernels.pairs import transition_pairs
from tests.kernels.helpers import gdn_inputs, rel_err


def _case(seed: int = 0, H: int = 2, HV: int = 4):
    """Three pieces of 5, 0 and 9 tokens around two bodies of 40 and 30 tokens, all from one stream."""
    x = gdn_inputs(5 + 40 + 9 + 30, H, HV, seed=seed)
    cut = [0, 5, 45, 54, 84]
    return x, cut


@pytest.mark.parametrize("H,HV", [(2, 4), (2, 2)])
def test_torch_twin_equals_one_pass(H, HV):
    """Bodies as exact pairs of their tokens: the scan reproduces one pass over the whole stream."""
    x, cut = _case(3, H, HV)
    full_o, full_h = gated_delta_rule(**x, output_final_state=True, use_qk_l2norm=True, backend="torch")
    body_idx = [torch.arange(cut[1], cut[2]), torch.arange(cut[3], cut[4])]
    idx = torch.cat(body_idx)
    T, S = transition_pairs(
        torch.nn.functional.normalize(x["k"][idx], dim=-1, eps=1e-6).float(), x["v"][idx], x["g"][idx],
        x["beta"][idx], cu_seqlens=torch.tensor([0, 40, 70], dtype=torch.int32), backend="torch",
    )  # fmt: skip
    act = torch.cat([torch.arange(cut[0], cut[1]), torch.arange(cut[2], cut[3])])
    chain = [Piece(0, 5), Body(T[0], S[0]), Piece(5, 14), Body(T[1], S[1])]
    sub = {name: t[act] for name, t in x.items()}
    h0 = torch.zeros(HV, 16, 8)
    o, h = gdn_combine_scan(**sub, chain=chain, h0=h0, backend="torch")
    assert rel_err(o, full_o[act]) < 1e-4
    assert rel_err(h, full_h[0]) < 1e-4


def test_addition_ignores_transitions():
    x = gdn_inputs(6, seed=1)
    T = torch.randn(4, 16, 16)
    S = torch.randn(4, 16, 8)
    h0 = torch.randn(4, 16, 8)
    _, h_add = gdn_combine_scan(**x, chain=[Body(T, S)], h0=h0, transition=False, backend="torch")
    _, h_tr = gdn_combine_scan(**x, chain=[Body(T, S)], h0=h0, transition=True, backend="torch")
    assert torch.allclose(h_add, h0 + S)
    assert torch.allclose(h_tr, torch.bmm(T, h0) + S, atol=1e-5)


def test_bad_chains_raise():
    x = gdn_inputs(6)
    h0 = torch.zeros(4, 16, 8)
    with pytest.raises(ValueError, match="outside"):
        gdn_combine_scan(**x, chain=[Piece(0, 7)], h0=h0, backend="torch")
    with pytest.raises(ValueError, match="body pair"):
        gdn_combine_scan(**x, chain=[Body(torch.zeros(4, 16, 8), torch.zeros(4, 16, 8))], h0=h0, backend="torch")
    with pytest.raises(ValueError, match="one dtype"):
        chain_tables([[Body(torch.zeros(4, 16, 16), torch.zeros(4, 16, 8, dtype=torch.bfloat16))]], torch.device("cpu"))
