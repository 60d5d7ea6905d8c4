"""Causal depthwise conv: vs F.conv1d, varlen, state chaining, step == sequence."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hypic_agent.kernels.conv import causal_conv1d, causal_conv1d_step

C, W = 6, 4


def _ref(x, w, b, act=True):
    y = F.conv1d(x.T[None], w[:, None, :], b, padding=W - 1, groups=C)[0, :, : x.shape[0]].T
    return F.silu(y) if act else y


@pytest.mark.parametrize("bias", [True, False])
def test_matches_conv1d(bias):
    torch.manual_seed(0)
    x, w = torch.randn(11, C), torch.randn(C, W)
    b = torch.randn(C) if bias else None
    y, st = causal_conv1d(x, w, b, backend="torch")
    assert torch.allclose(y, _ref(x, w, b), atol=1e-6)
    assert torch.equal(st[0], x[-(W - 1) :].T)
    y2, _ = causal_conv1d(x, w, b, activation=None, backend="torch")
    assert torch.allclose(y2, _ref(x, w, b, act=False), atol=1e-6)


def test_varlen_and_initial_state():
    torch.manual_seed(1)
    lens = [5, 1, 0, 9]
    cu = torch.tensor([0, 5, 6, 6, 15], dtype=torch.int32)
    x, w, b = torch.randn(15, C), torch.randn(C, W), torch.randn(C)
    h0 = torch.randn(4, C, W - 1)
    y, st = causal_conv1d(x, w, b, cu_seqlens=cu, initial_state=h0, backend="torch")
    for i, n in enumerate(lens):
        a = int(cu[i])
        full = torch.cat([h0[i].T, x[a : a + n]])  # state inputs then the sequence
        ref = _ref(full, w, b)[W - 1 :]
        assert torch.allclose(y[a : a + n], ref, atol=1e-6)
        assert torch.equal(st[i], full[-(W - 1) :].T)


def test_chaining_and_step():
    torch.manual_seed(2)
    x, w, b = torch.randn(10, C), torch.randn(C, W), torch.randn(C)
    y, st = causal_conv1d(x, w, b, backend="torch")
    ya, sa = causal_conv1d(x[:2], w, b, backend="torch")
    yb, sb = causal_conv1d(x[2:], w, b, initial_state=sa, backend="torch")
    assert torch.allclose(torch.cat([ya, yb]), y, atol=1e-6) and torch.equal(sb, st)
    s = torch.zeros(1, C, W - 1)
    for t in range(10):
        yt, s = causal_conv1d_step(x[t : t + 1], s, w, b)
        assert torch.allclose(yt[0], y[t], atol=1e-6)
    assert torch.equal(s, st)


def test_bad_state_shape():
    with pytest.raises(ValueError):
        causal_conv1d(torch.randn(4, C), torch.randn(C, W), initial_state=torch.zeros(1, C, W), backend="torch")
