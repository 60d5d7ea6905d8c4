"""RoPE: matches transformers (llama full, qwen3_5 partial) and re-rotation is additive."""

from __future__ import annotations

import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as llama_rope
from transformers.models.qwen3_5.modeling_qwen3_5 import apply_rotary_pos_emb as qwen_rope

from hypic_agent.kernels.rope import apply_rope, rope_cos_sin


def _hf(fn, x, pos, rd, theta, D):
    cos, sin = rope_cos_sin(pos, rd, theta)
    # transformers' layout: q [B, H, T, D], cos [B, T, rd]
    out, _ = fn(x.transpose(0, 1)[None], x.transpose(0, 1)[None], cos[None], sin[None])
    return out[0].transpose(0, 1)


def _hf_cos_sin(pos, rd, theta):
    inv = 1.0 / (theta ** (torch.arange(0, rd, 2, dtype=torch.float) / rd))
    f = pos.float()[:, None] * inv
    e = torch.cat([f, f], -1)
    return e.cos(), e.sin()


def test_cos_sin_like_transformers():
    pos = torch.arange(0, 5000, 37)
    c, s = rope_cos_sin(pos, 64, 1e7)
    c2, s2 = _hf_cos_sin(pos, 64, 1e7)
    assert torch.equal(c, c2) and torch.equal(s, s2)


def test_matches_transformers_full_and_partial():
    torch.manual_seed(0)
    x = torch.randn(9, 3, 32)
    pos = torch.tensor([0, 1, 2, 5, 100, 101, 7, 3000, 4])
    full = apply_rope(x, pos, rotary_dim=32, theta=10000.0)
    assert torch.allclose(full, _hf(llama_rope, x, pos, 32, 10000.0, 32), atol=1e-6)
    part = apply_rope(x, pos, rotary_dim=8, theta=1e7)
    assert torch.allclose(part, _hf(qwen_rope, x, pos, 8, 1e7, 32), atol=1e-6)
    assert torch.equal(part[..., 8:], x[..., 8:])


def test_rerotation_is_additive():
    torch.manual_seed(1)
    x = torch.randn(16, 2, 64)
    p = torch.randint(0, 2000, (16,))
    d = torch.randint(0, 2000, (16,))
    for rd in (64, 16):
        twice = apply_rope(apply_rope(x, p, rotary_dim=rd, theta=1e6), d, rotary_dim=rd, theta=1e6)
        once = apply_rope(x, p + d, rotary_dim=rd, theta=1e6)
        assert (twice - once).abs().max() < 2e-3  # fp32 angle rounding at positions ~4000
    # exact inverse: rotating by -p undoes p
    back = apply_rope(apply_rope(x, p, rotary_dim=64, theta=1e6), -p, rotary_dim=64, theta=1e6)
    assert (back - x).abs().max() < 1e-4


def test_bf16_dtype():
    x = torch.randn(4, 2, 16, dtype=torch.bfloat16)
    assert apply_rope(x, torch.arange(4), rotary_dim=16, theta=1e4).dtype == torch.bfloat16
