"""KDA (``kernels.kda``; on CPU the dispatch runs the torch twin): transformers' recurrence, step, pool
slots, and pairs that compose exactly."""

from __future__ import annotations

import pytest
import torch

from hypic_agent.kernels import chain, kda


def _inputs(t: int, h: int = 2, kd: int = 8, vd: int = 6, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(t, h, kd, generator=g), torch.randn(t, h, kd, generator=g)
    v = torch.randn(t, h, vd, generator=g)
    logdecay = -torch.rand(t, h, kd, generator=g) * 0.2
    beta = torch.rand(t, h, generator=g)
    return q, k, v, logdecay, beta


def test_matches_transformers_recurrent_kda():
    from transformers.models.kimi_linear.modeling_kimi_linear import recurrent_kimi_delta_attention

    q, k, v, g, beta = _inputs(25)
    h0 = torch.randn(1, 2, 8, 6)
    ref_o, ref_s = recurrent_kimi_delta_attention(
        q[None], k[None], v[None], g=g[None], beta=beta[None], initial_state=h0.clone(), output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    o, fin = kda.kda(q, k, v, g, beta, initial_state=h0)
    assert torch.allclose(o, ref_o[0], atol=1e-5) and torch.allclose(fin, ref_s, atol=1e-5)


def test_step_and_varlen():
    q, k, v, g, beta = _inputs(20, seed=1)
    cu = torch.tensor([0, 7, 20], dtype=torch.int32)
    o, fin = kda.kda(q, k, v, g, beta, cu_seqlens=cu)
    o7, f7 = kda.kda(q[:7], k[:7], v[:7], g[:7], beta[:7])
    assert torch.allclose(o[:7], o7, atol=1e-6) and torch.allclose(fin[0], f7[0], atol=1e-6)
    s = torch.zeros(1, 2, 8, 6)
    for t in range(7, 20):
        ot, s = kda.kda_step(q[t : t + 1], k[t : t + 1], v[t : t + 1], g[t : t + 1], beta[t : t + 1], s)
        assert torch.allclose(ot[0], o[t], atol=1e-5)
    assert torch.allclose(s[0], fin[1], atol=1e-5)


def test_pairs_compose_to_the_one_pass_state():
    q, k, v, g, beta = _inputs(45, seed=2)
    h0 = torch.randn(2, 8, 6)
    cu = torch.tensor([0, 11, 30, 45], dtype=torch.int32)
    T, S = kda.kda_pairs(k, v, g, beta, cu_seqlens=cu)
    assert T.shape == (3, 2, 8, 8)
    states = chain.chain_scan(h0, T, S, backend="torch")
    _, ref = kda.kda(q, k, v, g, beta, initial_state=h0[None])
    assert ((states[-1] - ref[0]).norm() / ref[0].norm()).item() <= 1e-5


def test_decode_slots_step_their_slots_in_place():
    """The pool-indexed step (torch twin on CPU) equals ``kda_step`` on the gathered states, writes the
    new states into exactly the named slots and leaves the others alone."""
    q, k, v, g, beta = _inputs(3, seed=3)
    pool = torch.randn(5, 2, 8, 6, generator=torch.Generator().manual_seed(4))
    before = pool.clone()
    slots = torch.tensor([4, 0, 2])
    o = kda.kda_decode_slots(q, k, v, g, beta, pool, slots)
    ref_o, ref_s = kda.kda_step(q, k, v, g, beta, before[slots])
    assert torch.allclose(o, ref_o, atol=1e-6) and torch.allclose(pool[slots], ref_s, atol=1e-6)
    assert not torch.allclose(pool[slots], before[slots], atol=1e-3)
    assert torch.equal(pool[torch.tensor([1, 3])], before[torch.tensor([1, 3])])
    with pytest.raises(ValueError, match="state_pool"):
        kda.kda_decode_slots(q, k, v, g, beta, pool[:, :, :, :4], slots)
