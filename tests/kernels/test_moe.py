"""MoE experts vs transformers' Qwen3_5MoeExperts on the same weights."""

from __future__ import annotations

import torch
from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeExperts

from hypic_agent.kernels.moe import moe_experts


def test_matches_transformers():
    torch.manual_seed(0)
    cfg = Qwen3_5MoeTextConfig(hidden_size=16, moe_intermediate_size=8, num_experts=6, num_experts_per_tok=2)
    ex = Qwen3_5MoeExperts(cfg)
    with torch.no_grad():
        ex.gate_up_proj.normal_()
        ex.down_proj.normal_()
    T = 13
    x = torch.randn(T, 16)
    idx = torch.stack([torch.randperm(5)[:2] for _ in range(T)])  # expert 5 never hit
    w = torch.softmax(torch.randn(T, 2), -1)
    with torch.no_grad():
        ref = ex(x, idx, w)
    out = moe_experts(x, idx, w, ex.gate_up_proj.data, ex.down_proj.data)
    assert torch.allclose(out, ref, atol=1e-5)
    assert moe_experts(x[:0], idx[:0], w[:0], ex.gate_up_proj.data, ex.down_proj.data).shape == (0, 16)
