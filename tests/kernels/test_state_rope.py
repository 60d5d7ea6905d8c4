"""State re-rotation (``kernels.state_rope``) is exact in fp32: a segment's pair built with keys
rotated at local positions, rotated to its global offset and composed, equals the one-pass state
with keys rotated at global positions; skipping the rotation does not."""

from __future__ import annotations

import pytest
import torch

from hypic_agent.kernels import decay_attention as decay
from hypic_agent.kernels.gdn import gated_delta_rule
from hypic_agent.kernels.pairs import transition_pairs
from hypic_agent.kernels.rope import apply_rope
from hypic_agent.kernels.state_rope import rotate_state, rotate_transition

H, K, V, ROT, THETA = 4, 16, 8, 8, 10000.0  # partial rotary: 8 of 16 key dims


def _rot(x: torch.Tensor, start: int) -> torch.Tensor:
    return apply_rope(x, torch.arange(start, start + x.shape[0]), rotary_dim=ROT, theta=THETA)


def _data(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(n, H, K, generator=g, dtype=torch.float64).float()
    v = torch.randn(n, H, V, generator=g)
    logdecay = -torch.rand(n, H, generator=g) * 0.05  # slow decay: old keys matter
    return k, v, logdecay


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("offset", [1, 37, 1000])
def test_decay_only_state_rerotated_equals_one_pass(offset):
    ka, va, ga = _data(offset, 0)
    kb, vb, gb = _data(50, 1)
    # one pass over A then B, every key rotated at its global position
    k_all = torch.cat([_rot(ka, 0), _rot(kb, offset)])
    _, full = decay.decay_pairs(
        k_all, torch.cat([va, vb]), torch.cat([ga, gb]), cu_seqlens=torch.tensor([0, offset + 50])
    )
    # cached: A's state (its own positions are global), B's pair built alone at local positions 0..49
    _, sa = decay.decay_pairs(_rot(ka, 0), va, ga, cu_seqlens=torch.tensor([0, offset]))
    tb, sb = decay.decay_pairs(_rot(kb, 0), vb, gb, cu_seqlens=torch.tensor([0, 50]))
    tb_g = rotate_transition(tb[0], offset, rotary_dim=ROT, theta=THETA)
    assert torch.equal(tb_g, tb[0])  # a per-head decay does not rotate
    sb_g = rotate_state(sb[0], offset, rotary_dim=ROT, theta=THETA)
    composed = decay.decay_chain(sa[0], tb_g[None], sb_g[None])[-1]
    assert rel(composed, full[0]) <= 1e-5
    skipped = decay.decay_chain(sa[0], tb, sb)[-1]
    assert rel(skipped, full[0]) > 0.05  # keys at the wrong angle


def test_delta_rule_pair_rerotated_equals_one_pass():
    """A dense transition (gated delta rule, keys l2-normed then rotated: rotation keeps the norm)
    rotates as R T R^T."""
    offset = 23
    ka, va, ga = _data(offset, 2)
    kb, vb, gb = _data(40, 3)
    beta = torch.rand(offset + 40, H, generator=torch.Generator().manual_seed(4)) * 0.5
    norm = torch.nn.functional.normalize
    k_all = torch.cat([_rot(norm(ka, dim=-1), 0), _rot(norm(kb, dim=-1), offset)])
    v_all, g_all = torch.cat([va, vb]), torch.cat([ga, gb])
    _, full = gated_delta_rule(k_all, k_all, v_all, g_all, beta, use_qk_l2norm=False, backend="torch")
    _, sa = gated_delta_rule(
        k_all[:offset], k_all[:offset], va, ga, beta[:offset], use_qk_l2norm=False, backend="torch"
    )
    kb_loc = _rot(norm(kb, dim=-1), 0)
    tb, sb = transition_pairs(kb_loc, vb, gb, beta[offset:], cu_seqlens=torch.tensor([0, 40], dtype=torch.int32),
                              use_qk_l2norm=False)  # fmt: skip
    tg = rotate_transition(tb[0], offset, rotary_dim=ROT, theta=THETA)
    sg = rotate_state(sb[0], offset, rotary_dim=ROT, theta=THETA)
    composed = torch.einsum("hkj,hjv->hkv", tg, sa[0]) + sg
    assert rel(composed, full[0]) <= 1e-5
    skipped = torch.einsum("hkj,hjv->hkv", tb[0], sa[0]) + sb[0]
    assert rel(skipped, full[0]) > 0.05
