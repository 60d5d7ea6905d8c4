"""Varlen GQA attention vs a dense per-sequence softmax reference."""

from __future__ import annotations

import torch

from hypic_agent.kernels.attention import attention


def _ref(q, k, v, qp, kp, scale):
    """q [Lq,Hq,D], k/v [Lk,Hkv,*] -> [Lq,Hq,Dv] with mask k_pos <= q_pos, empty rows -> 0."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = torch.einsum("qhd,khd->hqk", q, k).double() * scale
    mask = kp[None, :] <= qp[:, None]
    s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return torch.einsum("hqk,khd->qhd", p, v.double()).float()


def test_prefill_causal_gqa():
    torch.manual_seed(0)
    cu = torch.tensor([0, 5, 12, 12, 20], dtype=torch.int32)
    q, k, v = torch.randn(20, 4, 8), torch.randn(20, 2, 8), torch.randn(20, 2, 6)
    o = attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, scale=0.3)
    for i in range(4):
        a, b = int(cu[i]), int(cu[i + 1])
        p = torch.arange(b - a)
        assert torch.allclose(o[a:b], _ref(q[a:b], k[a:b], v[a:b], p, p, 0.3), atol=1e-5)


def test_bottom_right_default_and_positions():
    torch.manual_seed(1)
    cq = torch.tensor([0, 2, 5], dtype=torch.int32)
    ck = torch.tensor([0, 6, 10], dtype=torch.int32)
    q, k, v = torch.randn(5, 2, 8), torch.randn(10, 1, 8), torch.randn(10, 1, 8)
    o = attention(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck)
    assert torch.allclose(o[:2], _ref(q[:2], k[:6], v[:6], torch.arange(4, 6), torch.arange(6), 8**-0.5), atol=1e-5)
    assert torch.allclose(o[2:], _ref(q[2:], k[6:], v[6:], torch.arange(1, 4), torch.arange(4), 8**-0.5), atol=1e-5)
    # explicit (e.g. spliced, non-contiguous) positions; query 0 of seq 0 sees nothing -> zeros
    qpos = torch.tensor([0, 50, 7, 8, 9])
    kpos = torch.tensor([3, 4, 10, 11, 12, 40, 0, 1, 2, 20])
    o = attention(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, q_positions=qpos, k_positions=kpos)
    assert torch.equal(o[0], torch.zeros_like(o[0]))
    assert torch.allclose(o[:2], _ref(q[:2], k[:6], v[:6], qpos[:2], kpos[:6], 8**-0.5), atol=1e-5)
    assert torch.allclose(o[2:], _ref(q[2:], k[6:], v[6:], qpos[2:], kpos[6:], 8**-0.5), atol=1e-5)


def test_single_sequence_defaults():
    torch.manual_seed(2)
    q, k, v = torch.randn(3, 2, 4), torch.randn(7, 2, 4), torch.randn(7, 2, 4)
    o = attention(q, k, v)
    assert torch.allclose(o, _ref(q, k, v, torch.arange(4, 7), torch.arange(7), 0.5), atol=1e-5)
