"""Plain-PyTorch gated delta rule: input preparation, a chunked (WY/UT) implementation and a
per-token recurrent reference.

Per value head the state ``S [K, V]`` evolves as (fla layout, keys -> values)::

    S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,    o_t = S_t^T q_t

Everything here works on *prepared* fp32 inputs: q/k already expanded to the value heads (GVA),
L2-normalised if asked and q multiplied by ``scale`` (see ``prepare``).
"""

from __future__ import annotations

import itertools

import torch

CHUNK = 64


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dim (fla / transformers convention)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def prepare(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    use_qk_l2norm: bool,
    scale: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp32 copies with GVA expansion, optional L2 norm and query scaling.

    q, k ``[..., H, K]``; v ``[..., HV, V]``; g, beta ``[..., HV]`` (any leading dims).
    Returns q, k ``[..., HV, K]`` (q scaled by ``scale`` or ``K**-0.5``), v, g, beta in fp32.
    Query/key head ``h`` serves value heads ``h*r .. h*r+r-1`` (``r = HV // H``).
    """
    h, hv = k.shape[-2], v.shape[-2]
    if q.shape != k.shape or hv % h != 0:
        raise ValueError(
            f"need q, k [..., H, K] equal and HV % H == 0; got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if g.shape != v.shape[:-1] or beta.shape != v.shape[:-1]:
        raise ValueError(
            f"g and beta must be [..., HV] = {tuple(v.shape[:-1])}, got {tuple(g.shape)} and {tuple(beta.shape)}"
        )
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    if hv != h:
        q = q.repeat_interleave(hv // h, dim=-2)
        k = k.repeat_interleave(hv // h, dim=-2)
    q = q * (q.shape[-1] ** -0.5 if scale is None else scale)
    return q, k, v, g, beta


def recurrent(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-by-token reference on prepared inputs, batched over a leading dim.

    q, k ``[B, L, HV, K]``; v ``[B, L, HV, V]``; g, beta ``[B, L, HV]``; state ``[B, HV, K, V]``.
    Returns o ``[B, L, HV, V]`` and the final state ``[B, HV, K, V]`` (fp32).
    """
    s = state.float().clone()
    out = []
    for t in range(q.shape[1]):
        s = s * g[:, t].exp()[..., None, None]
        kt = k[:, t]
        pred = torch.einsum("bhk,bhkv->bhv", kt, s)
        delta = (v[:, t] - pred) * beta[:, t, :, None]
        s = s + kt[..., :, None] * delta[..., None, :]
        out.append(torch.einsum("bhk,bhkv->bhv", q[:, t], s))
    o = torch.stack(out, dim=1) if out else v.new_zeros(v.shape)
    return o, s


def _chunk_factors(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """Intra-chunk factors for chunks ``q, k [C, HV, L, K]``, ``v [C, HV, L, V]``, ``g, beta [C, HV, L]``.

    Returns (u, w, qd, kd, attn, decay): u ``[C,HV,L,V]`` and w ``[C,HV,L,K]`` from the UT transform
    (``v_new = u - w @ S``), qd = q exp(cum), kd = k exp(cum_L - cum), attn ``[C,HV,L,L]`` the
    decayed causal q k^T, decay ``[C,HV]`` = exp(cum_L).
    """
    L = q.shape[-2]
    cum = g.cumsum(-1)
    upper = torch.ones(L, L, dtype=torch.bool, device=q.device).triu(1)
    pair = (cum[..., :, None] - cum[..., None, :]).masked_fill(upper, float("-inf")).exp()
    kb = k * beta[..., None]
    a = (kb @ k.transpose(-1, -2)) * pair
    rhs = torch.cat([v * beta[..., None], kb * cum.exp()[..., None]], dim=-1)
    sol = torch.linalg.solve_triangular(a, rhs, upper=False, unitriangular=True)
    u, w = sol.split([v.shape[-1], k.shape[-1]], dim=-1)
    attn = (q @ k.transpose(-1, -2)) * pair
    qd = q * cum.exp()[..., None]
    kd = k * (cum[..., -1:] - cum).exp()[..., None]
    return u, w, qd, kd, attn, cum[..., -1].exp()


def chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state: torch.Tensor,
    chunk: int = CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked gated delta rule over packed sequences, on prepared fp32 inputs.

    q, k ``[T, HV, K]``; v ``[T, HV, V]``; g, beta ``[T, HV]``; cu_seqlens ``[N+1]``;
    state ``[N, HV, K, V]``. Returns o ``[T, HV, V]`` and final states ``[N, HV, K, V]``.

    Each sequence is cut into chunks of ``chunk`` tokens (the tail padded with identity tokens:
    beta = g = 0, k = 0); the UT factors of all real chunks are computed in one batch, then one
    sequential scan over chunk index advances all N states together.
    """
    T, HV, _ = k.shape
    V = v.shape[-1]
    dev = q.device
    n = cu_seqlens.numel() - 1
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    nch = (lens + chunk - 1) // chunk
    max_c = int(nch.max()) if n else 0
    s = state.float().clone()
    o = q.new_zeros(T, HV, V)
    if max_c == 0:
        return o, s
    # token index of every (sequence, chunk, position); T marks padding (an appended zero row)
    pos = torch.arange(max_c * chunk, device=dev).view(1, max_c, chunk)
    idx = cu_seqlens[:-1].long().view(n, 1, 1) + pos
    idx = torch.where(pos < lens.view(n, 1, 1), idx, torch.full_like(idx, T))
    valid = torch.arange(max_c, device=dev).view(1, max_c) < nch.view(n, 1)  # [N, maxC]
    tok = idx[valid]  # [Ctot, L]

    def gather(x: torch.Tensor) -> torch.Tensor:
        x = torch.cat([x, x.new_zeros(1, *x.shape[1:])])[tok]  # [Ctot, L, HV, ...]
        return x.movedim(1, 2) if x.dim() == 4 else x.transpose(1, 2)

    u, w, qd, kd, attn, decay = _chunk_factors(gather(q), gather(k), gather(v), gather(g), gather(beta))

    def spread(x: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        out = x.new_full((n, max_c, *x.shape[1:]), fill)
        out[valid] = x
        return out.transpose(0, 1)  # [maxC, N, ...]

    u, w, qd, kd, attn = (spread(x) for x in (u, w, qd, kd, attn))
    decay = spread(decay, 1.0)
    outs = []
    for c in range(max_c):
        v_new = u[c] - w[c] @ s
        outs.append(qd[c] @ s + attn[c] @ v_new)
        s = s * decay[c][..., None, None] + kd[c].transpose(-1, -2) @ v_new
    oc = torch.stack(outs, dim=1)[valid]  # [Ctot, HV, L, V]
    oc = oc.transpose(1, 2)  # [Ctot, L, HV, V]
    real = tok < T
    o[tok[real]] = oc[real]
    return o, s


def wy_factors(
    k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, cu_seqlens: list[int], chunk: int = CHUNK
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fla's per-chunk factors in fla's layout (the twin of ``chunk_local_cumsum`` (log2) +
    ``chunk_gated_delta_rule_fwd_intra``), for kernels that consume them.

    k ``[T, H, K]`` (already normalised), v ``[T, HV, V]``, g, beta ``[T, HV]``; ``cu_seqlens`` host
    bounds (chunks restart at every sequence) -> w ``[T, HV, K]``, u ``[T, HV, V]`` and gc ``[T, HV]``
    (cumulative log2 decay within each chunk), fp32: a chunk's state pass is
    ``v_new = u - w h``, ``h <- exp2(gc_L) h + k^T (exp2(gc_L - gc) v_new)``.
    """
    T, H, K = k.shape
    HV, V = v.shape[1], v.shape[2]
    w = k.new_zeros(T, HV, K, dtype=torch.float32)
    u = v.new_zeros(T, HV, V, dtype=torch.float32)
    gc = g.new_zeros(T, HV, dtype=torch.float32)
    for lo_seq, hi_seq in itertools.pairwise(cu_seqlens):
        for lo in range(lo_seq, hi_seq, chunk):
            s = slice(lo, min(lo + chunk, hi_seq))
            kk = k[s].float().repeat_interleave(HV // H, 1).transpose(0, 1)
            gg = g[s].float().T
            uu, ww, *_ = _chunk_factors(kk, kk, v[s].float().transpose(0, 1), gg, beta[s].float().T)
            w[s], u[s], gc[s] = ww.transpose(0, 1), uu.transpose(0, 1), (gg.cumsum(-1) * 1.4426950408889634).T
    return w, u, gc
