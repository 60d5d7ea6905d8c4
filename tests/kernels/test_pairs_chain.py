"""Transition pairs compose to the one-pass state; chain scan matches the pair recurrence."""

from __future__ import annotations

import pytest
import torch

from hypic_agent.kernels.chain import chain_scan, chain_scan_torch
from hypic_agent.kernels.gdn import gated_delta_rule
from hypic_agent.kernels.gdn.gdn_torch import l2norm
from hypic_agent.kernels.pairs import apply_pair, transition_pairs
from tests.kernels.helpers import gdn_inputs, rel_err

LENS = [70, 0, 45, 130]


def _cu(lens):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)


@pytest.mark.parametrize("H,HV", [(2, 4), (2, 2)])
def test_composition_equals_one_pass(H, HV):
    x = gdn_inputs(sum(LENS), H, HV, seed=7)
    h0 = torch.randn(1, HV, 16, 8)
    _, s_full = gated_delta_rule(**x, initial_state=h0, backend="torch")
    T, S = transition_pairs(x["k"], x["v"], x["g"], x["beta"], cu_seqlens=_cu(LENS), backend="torch")
    assert T.shape == (4, HV, 16, 16) and S.shape == (4, HV, 16, 8)
    assert T.dtype == S.dtype == torch.float32
    h = h0[0]
    for i in range(len(LENS)):
        h = apply_pair(T[i], S[i], h)
    assert rel_err(h, s_full[0]) <= 1e-5
    assert rel_err(S.sum(0) + h0[0], s_full[0]) > 0.1  # naive addition drops T
    states = chain_scan(h0[0], T, S, backend="torch")
    assert states.shape == (5, HV, 16, 8) and torch.equal(states[0], h0[0])
    assert rel_err(states[-1], s_full[0]) <= 1e-5
    # intermediate states equal one-pass prefixes
    _, s_ab = gated_delta_rule(**{n: t[:70] for n, t in x.items()}, initial_state=h0, backend="torch")
    assert rel_err(states[1], s_ab[0]) <= 1e-5 and torch.equal(states[2], states[1])


def test_pair_matches_token_product():
    x = gdn_inputs(9, 1, 2, K=4, V=3, seed=8)
    T, S = transition_pairs(x["k"], x["v"], x["g"], x["beta"], backend="torch")
    k = l2norm(x["k"]).repeat_interleave(2, dim=1)
    ref = torch.eye(4).expand(2, 4, 4)
    for t in range(9):
        kt = k[t]  # [HV, K]
        a = x["g"][t].exp()[:, None, None] * (
            torch.eye(4) - x["beta"][t][:, None, None] * kt[:, :, None] * kt[:, None, :]
        )
        ref = a @ ref
    assert (T[0] - ref).abs().max() < 1e-6
    _, s0 = gated_delta_rule(**x, backend="torch")
    assert (S[0] - s0[0]).abs().max() < 1e-6


def test_empty_sequence_is_identity():
    x = gdn_inputs(5, seed=9)
    T, S = transition_pairs(x["k"], x["v"], x["g"], x["beta"], cu_seqlens=_cu([0, 5, 0]), backend="torch")
    assert torch.equal(T[0], torch.eye(16).expand(4, 16, 16)) and torch.equal(S[2], torch.zeros(4, 16, 8))


def test_chain_reference_and_shapes():
    torch.manual_seed(0)
    h0, T, S = torch.randn(3, 8, 5), torch.randn(6, 3, 8, 8) * 0.3, torch.randn(6, 3, 8, 5)
    out = chain_scan(h0, T, S, backend="torch")
    h = h0
    for i in range(6):
        h = T[i] @ h + S[i]
        assert torch.allclose(out[i + 1], h, atol=1e-6)
    last = chain_scan(h0, T, S, backend="torch", last_only=True)
    assert last.shape == (3, 8, 5) and torch.equal(last, out[-1])
    assert chain_scan_torch(h0, T[:0], S[:0]).shape == (1, 3, 8, 5)
    with pytest.raises(ValueError):
        chain_scan(h0, T[:, :, :4], S, backend="torch")


def test_compose_bodies_is_the_chain_from_zero():
    from hypic_agent.kernels.chain import compose_bodies

    g = torch.Generator().manual_seed(1)

    def pair() -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(2, 8, 8, generator=g) * 0.3, torch.randn(2, 8, 5, generator=g)

    chains = [[pair() for _ in range(3)] for _ in range(2)]
    got = compose_bodies(chains)
    for c, h in zip(chains, got, strict=True):
        T, S = torch.stack([p[0] for p in c]), torch.stack([p[1] for p in c])
        assert torch.allclose(h, chain_scan_torch(torch.zeros(2, 8, 5), T, S)[-1], atol=1e-5)
    summed = compose_bodies(chains, transition=False)
    assert torch.allclose(summed[0], sum(p[1] for p in chains[0]), atol=1e-6)
    with pytest.raises(ValueError, match="at least one pair"):
        compose_bodies([[]])
