"""Kimi Delta Attention (KDA): the gated delta rule with a per-key-channel decay, plain PyTorch (the
twin of ``kda_fla``; ``kernels.kda`` dispatches).

Per head, with q, k l2-normed (eps 1e-6, inside), q scaled by ``K^-0.5``, a log-decay ``g [K]`` per
key channel and ``beta`` per head:

    S_t = (I - beta_t k_t k_t^T) Diag(exp g_t) S_{t-1} + beta_t k_t v_t^T        o_t = q_t^T S_t

(state ``[K, V]``, fla layout). A span's transition ``T = prod_t (I - beta_t k_t k_t^T) Diag(exp g_t)``
is dense ``[K, K]``, like GDN's, so KDA pairs compose with ``kernels.chain``. This is the reference
(a token loop, fp32), run on CPU and as the GPU tests' oracle.
"""

from __future__ import annotations

import itertools

import torch

from ..gdn.gdn_torch import l2norm


def _bounds(cu_seqlens: torch.Tensor | None, total: int) -> list[int]:
    return [0, total] if cu_seqlens is None else [int(x) for x in cu_seqlens.tolist()]


def _prep(q: torch.Tensor | None, k: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
    qn = None if q is None else l2norm(q.float()) * q.shape[-1] ** -0.5
    return qn, l2norm(k.float())


def _step(s: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """s ``[..., H, K, V]``, k ``[..., H, K]``, v ``[..., H, V]``, g ``[..., H, K]``, beta ``[..., H]``."""
    s = s * g.exp()[..., None]
    delta = (v - torch.einsum("...hk,...hkv->...hv", k, s)) * beta[..., None]
    return s + k[..., :, None] * delta[..., None, :]


def kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k ``[T, H, K]``, v ``[T, H, V]``, g ``[T, H, K]``, beta ``[T, H]``, ``initial_state [N, H, K, V]``
    (None: zeros) -> (o ``[T, H, V]`` fp32, final states ``[N, H, K, V]`` fp32)."""
    qn, kn = _prep(q, k)
    assert qn is not None
    vf, gf, bf = v.float(), g.float(), beta.float()
    bounds = _bounds(cu_seqlens, v.shape[0])
    n, h, kd, vd = len(bounds) - 1, v.shape[1], k.shape[2], v.shape[2]
    states = initial_state.float() if initial_state is not None else vf.new_zeros(n, h, kd, vd)
    out = vf.new_zeros(v.shape[0], h, vd)
    finals = []
    for i, (a, b) in enumerate(itertools.pairwise(bounds)):
        s = states[i]
        for t in range(a, b):
            s = _step(s, kn[t], vf[t], gf[t], bf[t])
            out[t] = torch.einsum("hk,hkv->hv", qn[t], s)
        finals.append(s)
    return out, torch.stack(finals) if finals else states


def kda_step(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence: q, k ``[N, H, K]``, v ``[N, H, V]``, g ``[N, H, K]``, beta ``[N, H]``,
    state ``[N, H, K, V]`` -> (o ``[N, H, V]`` fp32, new state fp32)."""
    qn, kn = _prep(q, k)
    assert qn is not None
    new = _step(state.float(), kn, v.float(), g.float(), beta.float())
    return torch.einsum("nhk,nhkv->nhv", qn, new), new


def kda_pairs(
    k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, *, cu_seqlens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence's pair from a zero state: (T ``[N, H, K, K]``, S ``[N, H, K, V]``), fp32. T is the
    token steps applied to the identity (each column of I is a state with V = K columns and v = 0)."""
    _, kn = _prep(None, k)
    vf, gf, bf = v.float(), g.float(), beta.float()
    bounds = _bounds(cu_seqlens, v.shape[0])
    h, kd, vd = v.shape[1], k.shape[2], v.shape[2]
    Ts, Ss = [], []
    for a, b in itertools.pairwise(bounds):
        t_acc = torch.eye(kd, device=vf.device).expand(h, kd, kd).clone()
        s = vf.new_zeros(h, kd, vd)
        zero = vf.new_zeros(h, kd)
        for t in range(a, b):
            t_acc = _step(t_acc, kn[t], zero, gf[t], bf[t])
            s = _step(s, kn[t], vf[t], gf[t], bf[t])
        Ts.append(t_acc)
        Ss.append(s)
    if not Ts:
        return vf.new_zeros(0, h, kd, kd), vf.new_zeros(0, h, kd, vd)
    return torch.stack(Ts), torch.stack(Ss)


def kda_decode_slots_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state_pool: torch.Tensor,
    slots: torch.Tensor,
) -> torch.Tensor:
    """``kda_step`` of N rows against ``state_pool [S, H, K, V]`` fp32 at ``slots [N]`` (rows updated in
    place: a gather, the step, a scatter) -> o ``[N, H, V]`` fp32."""
    o, new = kda_step(q, k, v, g, beta, state_pool.index_select(0, slots))
    state_pool.index_copy_(0, slots, new)
    return o
