"""Decay-only linear attention (``kernels.decay_attention``, Mamba2's SSD; on CPU the dispatch runs the
torch twin): chunked scan, step, pairs and chain against the per-token recurrence
S_t = exp(g_t) S_{t-1} + k_t v_t^T, o_t = q_t^T S_t."""

from __future__ import annotations

import pytest
import torch

from hypic_agent.kernels import decay_attention as decay
from hypic_agent.kernels.decay_attention import decay_attention_torch


def _inputs(t: int, groups: int = 2, heads: int = 4, kd: int = 8, vd: int = 6, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(t, groups, kd, generator=g)
    k = torch.randn(t, groups, kd, generator=g)
    v = torch.randn(t, heads, vd, generator=g)
    logdecay = -torch.rand(t, heads, generator=g) * 0.3  # decays 0.74..1: long memory
    return q, k, v, logdecay


def _loop(q, k, v, g, h):
    """Per-token reference for one sequence (fp64). Head h reads group h // (H / G)."""
    r = v.shape[1] // q.shape[1]
    qh, kh = q.double().repeat_interleave(r, 1), k.double().repeat_interleave(r, 1)
    h = h.double().clone()
    out = []
    for t in range(q.shape[0]):
        h = g[t].double().exp()[:, None, None] * h + kh[t][:, :, None] * v[t].double()[:, None, :]
        out.append(torch.einsum("hk,hkv->hv", qh[t], h))
    return torch.stack(out), h


@pytest.mark.parametrize("chunk", [4, 64])
def test_chunked_varlen_scan_equals_the_recurrence(chunk):
    lengths = [1, 13, 30]
    q, k, v, g = _inputs(sum(lengths))
    cu = torch.tensor([0, 1, 14, 44], dtype=torch.int32)
    h0 = torch.randn(3, 4, 8, 6, generator=torch.Generator().manual_seed(5))
    o, fin = decay_attention_torch.decay_attention(q, k, v, g, cu_seqlens=cu, initial_state=h0, chunk=chunk)
    for i, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
        ro, rf = _loop(q[a:b], k[a:b], v[a:b], g[a:b], h0[i])
        assert torch.allclose(o[a:b].double(), ro, atol=1e-5), i
        assert torch.allclose(fin[i].double(), rf, atol=1e-5), i


def test_step_equals_one_token_of_the_scan():
    q, k, v, g = _inputs(3)
    state = torch.randn(3, 4, 8, 6)
    o, new = decay.decay_step(q, k, v, g, state)
    cu = torch.arange(4, dtype=torch.int32)
    o2, fin = decay.decay_attention(q, k, v, g, cu_seqlens=cu, initial_state=state)
    assert torch.allclose(o, o2, atol=1e-6) and torch.allclose(new, fin, atol=1e-6)


def test_pairs_compose_to_the_one_pass_state():
    """Three spans' pairs (T a per-head decay [H], S [H, K, V]) chained from h0 give the state of one
    pass over all of them; dropping T (naive addition) does not."""
    q, k, v, g = _inputs(60, seed=2)
    h0 = torch.randn(4, 8, 6, generator=torch.Generator().manual_seed(9))
    cu = torch.tensor([0, 17, 40, 60], dtype=torch.int32)
    T, S = decay.decay_pairs(k, v, g, cu_seqlens=cu)
    assert T.shape == (3, 4) and S.shape == (3, 4, 8, 6)
    assert torch.allclose(T, torch.stack([g[a:b].sum(0).exp() for a, b in ((0, 17), (17, 40), (40, 60))]))
    states = decay.decay_chain(h0, T, S)
    _, ref = decay.decay_attention(q, k, v, g, initial_state=h0[None])
    rel = ((states[-1] - ref[0]).norm() / ref[0].norm()).item()
    assert rel <= 1e-5, rel
    # each intermediate state is the one-pass state at that boundary
    _, mid = decay.decay_attention(q[:40], k[:40], v[:40], g[:40], initial_state=h0[None])
    assert torch.allclose(states[2], mid[0], atol=1e-5)
    naive = h0 + S.sum(0)
    assert ((naive - ref[0]).norm() / ref[0].norm()).item() > 0.2


def test_pairs_of_no_sequences_are_empty():
    _, k, v, g = _inputs(0)
    T, S = decay.decay_pairs(k, v, g, cu_seqlens=torch.zeros(1, dtype=torch.int32))
    assert T.shape == (0, 4) and S.shape == (0, 4, 8, 6)


def test_an_empty_sequence_keeps_its_state():
    q, k, v, g = _inputs(5)
    cu = torch.tensor([0, 0, 5], dtype=torch.int32)
    h0 = torch.randn(2, 4, 8, 6, generator=torch.Generator().manual_seed(3))
    o, fin = decay.decay_attention(q, k, v, g, cu_seqlens=cu, initial_state=h0)
    _, one = decay.decay_attention(q, k, v, g, initial_state=h0[1:])
    assert o.shape == (5, 4, 6) and torch.equal(fin[0], h0[0]) and torch.allclose(fin[1], one[0])
