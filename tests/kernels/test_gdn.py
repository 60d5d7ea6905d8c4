"""Gated delta rule: chunked torch path vs transformers' references, varlen, state chaining, decode."""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen3_5.modeling_qwen3_5 import (
    torch_chunk_gated_delta_rule,
    torch_recurrent_gated_delta_rule,
)

from hypic_agent.kernels.gdn import gated_delta_rule, gated_delta_rule_naive, gated_delta_rule_step
from tests.kernels.helpers import gdn_inputs


def _hf(fn, x, h0=None, **kw):
    o, s = fn(
        x["q"][None],
        x["k"][None],
        x["v"][None],
        x["g"][None],
        x["beta"][None],
        initial_state=h0,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
        **kw,
    )
    return o[0], s


@pytest.mark.parametrize("T,H,HV", [(150, 2, 4), (64, 2, 2), (7, 1, 3)])
def test_matches_transformers(T, H, HV):
    x = gdn_inputs(T, H, HV, seed=T)
    h0 = torch.randn(1, HV, 16, 8)
    o, s = gated_delta_rule(**x, initial_state=h0, backend="torch")
    o_c, s_c = _hf(torch_chunk_gated_delta_rule, x, h0)
    o_r, s_r = _hf(torch_recurrent_gated_delta_rule, x, h0)
    for ref_o, ref_s in ((o_c, s_c), (o_r, s_r)):
        assert (o - ref_o).abs().max() < 1e-5
        assert (s - ref_s).abs().max() < 1e-5
    o_n, s_n = gated_delta_rule_naive(**x, initial_state=h0)
    assert (o - o_n).abs().max() < 1e-5 and (s - s_n).abs().max() < 1e-5


def test_varlen_equals_per_sequence():
    lens = [70, 1, 0, 130, 64]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    x = gdn_inputs(sum(lens), seed=1)
    h0 = torch.randn(len(lens), 4, 16, 8)
    o, s = gated_delta_rule(**x, cu_seqlens=cu, initial_state=h0, backend="torch")
    for i in range(len(lens)):
        a, b = int(cu[i]), int(cu[i + 1])
        xi = {n: t[a:b] for n, t in x.items()}
        oi, si = gated_delta_rule(**xi, initial_state=h0[i : i + 1], backend="torch")
        assert torch.allclose(o[a:b], oi, atol=1e-6)
        assert torch.allclose(s[i], si[0], atol=1e-6)
    o_n, s_n = gated_delta_rule_naive(**x, cu_seqlens=cu, initial_state=h0)
    assert (o - o_n).abs().max() < 1e-5 and (s - s_n).abs().max() < 1e-5


def test_initial_state_chaining():
    x = gdn_inputs(200, seed=2)
    o, s = gated_delta_rule(**x, backend="torch")
    xa = {n: t[:90] for n, t in x.items()}
    xb = {n: t[90:] for n, t in x.items()}
    oa, sa = gated_delta_rule(**xa, backend="torch")
    ob, sb = gated_delta_rule(**xb, initial_state=sa, backend="torch")
    assert (torch.cat([oa, ob]) - o).abs().max() < 1e-5
    assert (sb - s).abs().max() < 1e-5


def test_scale_and_no_l2norm():
    x = gdn_inputs(40, H=2, HV=2, seed=3)
    x["k"] = torch.nn.functional.normalize(x["k"], dim=-1)
    o1, s1 = gated_delta_rule(**x, use_qk_l2norm=False, scale=0.5, backend="torch")
    o2, s2 = gated_delta_rule_naive(**x, use_qk_l2norm=False, scale=0.5)
    assert (o1 - o2).abs().max() < 1e-5 and (s1 - s2).abs().max() < 1e-5


def test_step_equals_sequence():
    x = gdn_inputs(12, seed=4)
    h0 = torch.randn(1, 4, 16, 8)
    o, s = gated_delta_rule(**x, initial_state=h0, backend="torch")
    st = h0
    for t in range(12):
        ot, st = gated_delta_rule_step(*(x[n][t : t + 1] for n in ("q", "k", "v", "g", "beta")), st, backend="torch")
        assert (ot[0] - o[t]).abs().max() < 1e-5
    assert (st - s).abs().max() < 1e-5


def test_no_final_state_and_dtype():
    x = gdn_inputs(10, seed=5, dtype=torch.bfloat16)
    o, s = gated_delta_rule(**x, output_final_state=False, backend="torch")
    assert s is None and o.dtype == torch.bfloat16 and o.shape == (10, 4, 8)


def test_bad_shapes():
    x = gdn_inputs(10, seed=6)
    with pytest.raises(ValueError):
        gated_delta_rule(**x, initial_state=torch.zeros(2, 4, 16, 8), backend="torch")
    with pytest.raises(ValueError):
        gated_delta_rule(**x, cu_seqlens=torch.tensor([0, 4, 9]), backend="torch")
