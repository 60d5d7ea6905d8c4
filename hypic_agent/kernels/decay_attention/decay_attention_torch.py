"""Decay-only linear attention (Mamba2's SSD, Lightning / simple GLA without RoPE): the plain-PyTorch
reference (the twin of ``decay_attention_fla``; ``kernels.decay_attention`` dispatches).

Per head h and token t, with a scalar log-decay ``g[t, h] <= 0``:

    S_t = exp(g_t) S_{t-1} + k_t v_t^T        o_t = q_t^T S_t        (state ``[K, V]``, fla layout)

Mamba2 maps onto it as q = C, k = B, v = dt * x, g = dt * A (``y = C S + D x`` adds the skip outside).
q and k have G groups, v and g have H heads (H a multiple of G: head h reads group ``h // (H / G)``).

Because the transition is a scalar per head, a span C's pair is ``T_C = exp(sum g) [H]`` and
``S(C|0) [H, K, V]``; composing is ``S_after = T_C * S_in + S(C|0)``: a per-head scale, no matmul.
Everything runs in fp32; sequences of a packed batch (``cu_seqlens``) one after another, each in
``chunk``-token chunks (intra-chunk attention with the decay mask, inter-chunk state carry).
"""

from __future__ import annotations

import itertools

import torch

CHUNK = 64


def _heads(x: torch.Tensor, h: int) -> torch.Tensor:
    """``[T, G, K]`` -> ``[T, H, K]`` fp32 (group h // (H / G) for head h)."""
    return x.float().repeat_interleave(h // x.shape[1], dim=1)


def _bounds(cu_seqlens: torch.Tensor | None, total: int) -> list[int]:
    return [0, total] if cu_seqlens is None else [int(x) for x in cu_seqlens.tolist()]


def _run(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, h: torch.Tensor, chunk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence: q, k ``[L, H, K]``, v ``[L, H, V]``, g ``[L, H]`` fp32, h ``[H, K, V]`` ->
    (o ``[L, H, V]``, final ``[H, K, V]``)."""
    out = []
    for a in range(0, q.shape[0], chunk):
        qc, kc, vc, gc = q[a : a + chunk], k[a : a + chunk], v[a : a + chunk], g[a : a + chunk]
        n = qc.shape[0]
        cum = gc.cumsum(0)  # [n, H]
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        diff = (cum[:, None, :] - cum[None, :, :]).masked_fill(~causal[..., None], float("-inf"))
        att = torch.einsum("ihk,jhk->ijh", qc, kc) * diff.exp()  # [i, j, H]
        o = torch.einsum("ijh,jhv->ihv", att, vc) + torch.einsum("ihk,hkv->ihv", qc * cum.exp()[..., None], h)
        out.append(o)
        w = (cum[-1:] - cum).exp()  # [n, H]: decay from each token to the chunk's end
        h = cum[-1].exp()[:, None, None] * h + torch.einsum("jhk,jhv->hkv", kc * w[..., None], vc)
    return (torch.cat(out) if out else v[:0]), h  # an empty sequence: no rows, h as it came


def decay_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    chunk: int = CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k ``[T, G, K]``, v ``[T, H, V]``, g ``[T, H]`` (log-decay), ``initial_state [N, H, K, V]`` (None:
    zeros) -> (o ``[T, H, V]`` fp32, final states ``[N, H, K, V]`` fp32)."""
    nh, kd, vd = v.shape[1], k.shape[2], v.shape[2]
    qh, kh, vf, gf = _heads(q, nh), _heads(k, nh), v.float(), g.float()
    bounds = _bounds(cu_seqlens, v.shape[0])
    n = len(bounds) - 1
    h0 = (
        initial_state.float()
        if initial_state is not None
        else torch.zeros(n, nh, kd, vd, device=v.device, dtype=torch.float32)
    )
    outs, finals = [], []
    for i in range(n):
        a, b = bounds[i], bounds[i + 1]
        o, fin = _run(qh[a:b], kh[a:b], vf[a:b], gf[a:b], h0[i], chunk)
        outs.append(o)
        finals.append(fin)
    o = torch.cat(outs) if outs else vf.new_zeros(0, nh, vd)
    return o, torch.stack(finals) if finals else h0


def decay_step(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence: q, k ``[N, G, K]``, v ``[N, H, V]``, g ``[N, H]``, state ``[N, H, K, V]``
    -> (o ``[N, H, V]`` fp32, new state ``[N, H, K, V]`` fp32)."""
    nh = v.shape[1]
    qh, kh = _heads(q, nh), _heads(k, nh)
    new = g.float().exp()[..., None, None] * state.float() + kh[..., :, None] * v.float()[..., None, :]
    return torch.einsum("nhk,nhkv->nhv", qh, new), new


def decay_pairs(
    k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, *, cu_seqlens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence's pair from a zero state: k ``[T, G, K]``, v ``[T, H, V]``, g ``[T, H]`` ->
    (T ``[N, H]`` = exp(sum g), S ``[N, H, K, V]``), fp32. One einsum per sequence: the weight of token
    j in the final state is exp(sum of g after j) <= 1."""
    nh = v.shape[1]
    kh, vf, gf = _heads(k, nh), v.float(), g.float()
    bounds = _bounds(cu_seqlens, v.shape[0])
    Ts, Ss = [], []
    for a, b in itertools.pairwise(bounds):
        cum = gf[a:b].cumsum(0)
        total = cum[-1] if b > a else gf.new_zeros(nh)
        w = (total[None] - cum).exp()  # [L, H]
        Ts.append(total.exp())
        Ss.append(torch.einsum("jhk,jhv->hkv", kh[a:b] * w[..., None], vf[a:b]))
    if not Ts:  # no sequences (e.g. no segment has a body)
        return gf.new_zeros(0, nh), gf.new_zeros(0, nh, kh.shape[2], vf.shape[2])
    return torch.stack(Ts), torch.stack(Ss)


def decay_chain(h0: torch.Tensor, T: torch.Tensor, S: torch.Tensor) -> torch.Tensor:
    """States along a chain of pairs: h0 ``[H, K, V]``, T ``[n, H]``, S ``[n, H, K, V]`` -> ``[n+1, H, K, V]``
    fp32 with ``states[i+1] = T[i] * states[i] + S[i]`` (per-head scale)."""
    states = [h0.float()]
    for t, s in zip(T.float(), S.float(), strict=True):
        states.append(t[:, None, None] * states[-1] + s)
    return torch.stack(states)
