"""Combine scan in WY form: the state-independent work of every piece in parallel, then a short chain
(CUDA; imported lazily). Twins: ``combine_scan_torch.wy_factors_torch`` (the factors) and
``combine_scan_torch.gdn_combine_scan_torch`` (the whole scan, token loop).

The token-loop scan walks 210 dependent token steps per layer for a RAG prompt (20 seam windows of
8 tokens and a 50-token question), one round of reductions over K each, plus 20 body products whose
``T`` loads wait on the previous step: ~0.4 ms per layer on the H200. Here a piece is cut into
chunks of at most ``BT`` tokens and every chunk's *factors* are computed first, all chunks and value
heads in parallel (``_wy_factors_kernel``, grid ``(chunks, HV)``), from a zero entering state::

    A    = strict_tril(beta_i k_i . k_j exp(G_i - G_j))       G: cumulative log decay in the chunk
    w    = (I + A)^-1 (beta exp(G) k)       u  = (I + A)^-1 (beta v)
    kd   = exp(G_last - G) k                gam = exp(G_last)
    Aqk  = tril(q_i . k_j exp(G_i - G_j))   qp = exp(G) q - Aqk w       ol = Aqk u

so that a chunk entered with state ``h [K, V]`` gives ``o = ol + qp h`` and leaves
``h' = gam h + kd^T (u - w h)``. The chain (``_wy_chain_kernel``, grid ``(cdiv(V, BV), HV, N)``) then
walks *steps*: a step is one chunk (or none) followed by one cached body (or none,
``h <- T h + S``), so every step has the same shape and the loop can be software-pipelined (the
autotuner picks 1 or 2 stages). Per step the state sees three dots (``w h``, ``kd^T d``, ``T h``),
not one reduction round per token.

Precision: factors and the state are fp32. The factors' dots run in tf32x3 (about fp32, as
``chain_triton``); the chain's state dots too for fp32 outputs, in one tf32 pass for bf16 / fp16
outputs with fp32 pairs (``precise``; ``KernelConfig.precise_for_half``). bf16 pairs take two bf16
dots over a hi/lo split of the state (``pair_step``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..backend import autotune_cache, interpreting, to_device_async
from ..chain.chain_triton import pair_step


@triton.jit
def _dot(a, b):
    """fp32 ``a @ b`` at about fp32 accuracy (three tf32 tensor-core passes)."""
    return tl.dot(a, b, input_precision="tf32x3")


@triton.jit
def _state_dot(a, b, FAST: tl.constexpr):
    """fp32 ``a @ b`` of the chain: one tf32 pass with ``FAST`` (inputs rounded to 10 mantissa bits), else
    three (about fp32)."""
    if FAST:
        return tl.dot(a, b, input_precision="tf32")
    else:
        return tl.dot(a, b, input_precision="tf32x3")


@triton.jit
def _wy_factors_kernel(
    q, k, v, g, beta, chunks, w, kd, qp, u, ol, gam, scale, s_qk, s_v,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    BT: tl.constexpr, L2NORM: tl.constexpr,
):  # fmt: skip
    """One (chunk, value head). q, k ``[T, H, K]`` raw (normalised here if ``L2NORM``, q times
    ``scale``), v ``[T, HV, V]``, with row strides ``s_qk`` / ``s_v`` (heads and features dense: views
    of the conv's packed output), g, beta ``[T, HV]``, chunks ``[NC, 2]`` int32 -> w, kd, qp
    ``[T, HV, K]``, u, ol ``[T, HV, V]`` (rows of the chunk), gam ``[NC, HV]``, all fp32."""
    i_c = tl.program_id(0)
    i_hv = tl.program_id(1).to(tl.int64)
    i_h = i_hv // (HV // H)
    c0 = tl.load(chunks + i_c * 2).to(tl.int64)
    c1 = tl.load(chunks + i_c * 2 + 1).to(tl.int64)
    o_t = tl.arange(0, BT)
    rows = c0 + o_t
    m_t = rows < c1
    o_k = tl.arange(0, BK)
    o_v = tl.arange(0, BV)
    m_tk = m_t[:, None] & (o_k < K)[None, :]
    m_tv = m_t[:, None] & (o_v < V)[None, :]
    off_qk = rows[:, None] * s_qk + i_h * K + o_k[None, :]
    b_q = tl.load(q + off_qk, mask=m_tk, other=0.0).to(tl.float32)
    b_k = tl.load(k + off_qk, mask=m_tk, other=0.0).to(tl.float32)
    if L2NORM:
        b_q = b_q * (1.0 / tl.sqrt(tl.sum(b_q * b_q, 1) + 1e-6))[:, None]
        b_k = b_k * (1.0 / tl.sqrt(tl.sum(b_k * b_k, 1) + 1e-6))[:, None]
    b_q = b_q * scale
    b_v = tl.load(v + rows[:, None] * s_v + i_hv * V + o_v[None, :], mask=m_tv, other=0.0).to(tl.float32)
    b_g = tl.load(g + rows * HV + i_hv, mask=m_t, other=0.0).to(tl.float32)
    b_b = tl.load(beta + rows * HV + i_hv, mask=m_t, other=0.0).to(tl.float32)
    b_G = tl.cumsum(b_g, 0)
    g_last = tl.sum(b_g, 0)  # padding rows add nothing
    diff = b_G[:, None] - b_G[None, :]
    lower = o_t[:, None] > o_t[None, :]
    causal = o_t[:, None] >= o_t[None, :]
    # (I + A)^-1 by forward substitution, one row at a time (A is strictly lower: row i needs rows < i)
    b_a = tl.where(lower, _dot(b_k, tl.trans(b_k)) * tl.exp(tl.where(lower, diff, 0.0)) * b_b[:, None], 0.0)
    b_ti = tl.where(o_t[:, None] == o_t[None, :], 1.0, 0.0)
    for i in range(1, BT):
        a_i = tl.sum(tl.where(o_t[:, None] == i, b_a, 0.0), 0)  # row i of A, by column
        row = tl.where(o_t == i, 1.0, 0.0) - tl.sum(a_i[:, None] * b_ti, 0)
        b_ti = tl.where(o_t[:, None] == i, row[None, :], b_ti)
    e_g = tl.exp(b_G)
    b_w = _dot(b_ti, b_k * (b_b * e_g)[:, None])
    b_u = _dot(b_ti, b_v * b_b[:, None])
    b_kd = b_k * tl.where(m_t, tl.exp(g_last - b_G), 0.0)[:, None]
    b_aqk = tl.where(causal, _dot(b_q, tl.trans(b_k)) * tl.exp(tl.where(causal, diff, 0.0)), 0.0)
    b_qp = b_q * e_g[:, None] - _dot(b_aqk, b_w)
    b_ol = _dot(b_aqk, b_u)
    off_k = (rows[:, None] * HV + i_hv) * K + o_k[None, :]
    off_v = (rows[:, None] * HV + i_hv) * V + o_v[None, :]
    tl.store(w + off_k, b_w, mask=m_tk)
    tl.store(kd + off_k, b_kd, mask=m_tk)
    tl.store(qp + off_k, b_qp, mask=m_tk)
    tl.store(u + off_v, b_u, mask=m_tv)
    tl.store(ol + off_v, b_ol, mask=m_tv)
    tl.store(gam + i_c * HV + i_hv, tl.exp(g_last))


@triton.jit
def _wy_chain_kernel(
    w, kd, qp, u, ol, gam, o, h0, ht, meta, ptrs, bounds,
    HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
    TRANSITION: tl.constexpr, PAIR_BF16: tl.constexpr, SPLIT: tl.constexpr, STAGES: tl.constexpr,
    FAST: tl.constexpr,
):  # fmt: skip
    """Grid ``(cdiv(V, BV), HV, N)``: the ``[K, BV]`` slice of one value head's state of chain ``n``
    through its steps ``bounds[n]:bounds[n+1]`` (``bounds [N+1]`` int32; N chains of one forward, each
    over its own rows). meta ``[NS, 4]`` int32 (chunk start, end, chunk index or -1, has a body), ptrs
    ``[NS, 2]`` int64 (the body's T, S data pointers, 0 without one); h0, ht ``[N, HV, K, V]`` fp32;
    o ``[T, HV, V]``."""
    i_v = tl.program_id(0)
    i_hv = tl.program_id(1).to(tl.int64)
    i_n = tl.program_id(2).to(tl.int64)
    s0 = tl.load(bounds + i_n)
    s1 = tl.load(bounds + i_n + 1)
    h0 += i_n * HV * K * V
    ht += i_n * HV * K * V
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    o_t = tl.arange(0, BT)
    m_k = o_k < K
    m_v = o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    off_kv = o_k[:, None] * V + o_v[None, :]
    b_h = tl.load(h0 + i_hv * K * V + off_kv, mask=m_kv, other=0.0).to(tl.float32)
    pair_ty = tl.bfloat16 if PAIR_BF16 else tl.float32
    for s in tl.range(s0, s1, num_stages=STAGES):
        c0 = tl.load(meta + s * 4).to(tl.int64)
        c1 = tl.load(meta + s * 4 + 1)
        ci = tl.load(meta + s * 4 + 2)
        has = tl.load(meta + s * 4 + 3) != 0
        rows = c0 + o_t
        m_t = rows < c1
        m_tk = m_t[:, None] & m_k[None, :]
        m_tv = m_t[:, None] & m_v[None, :]
        off_k = (rows[:, None] * HV + i_hv) * K + o_k[None, :]
        off_v = (rows[:, None] * HV + i_hv) * V + o_v[None, :]
        b_w = tl.load(w + off_k, mask=m_tk, other=0.0)
        b_qp = tl.load(qp + off_k, mask=m_tk, other=0.0)
        b_kd = tl.load(kd + off_k, mask=m_tk, other=0.0)
        b_u = tl.load(u + off_v, mask=m_tv, other=0.0)
        b_ol = tl.load(ol + off_v, mask=m_tv, other=0.0)
        b_g = tl.load(gam + ci * HV + i_hv, mask=ci >= 0, other=1.0)
        p_s = tl.load(ptrs + s * 2 + 1).to(tl.pointer_type(pair_ty))
        b_s = tl.load(p_s + i_hv * K * V + off_kv, mask=m_kv & has, other=0.0).to(tl.float32)
        # the chunk: its outputs from the entering state, then the state through it
        b_d = b_u - _state_dot(b_w, b_h, FAST)
        tl.store(o + off_v, (b_ol + _state_dot(b_qp, b_h, FAST)).to(o.dtype.element_ty), mask=m_tv)
        b_h = b_h * b_g + _state_dot(tl.trans(b_kd), b_d, FAST)
        # the body
        if TRANSITION:
            p_t = tl.load(ptrs + s * 2).to(tl.pointer_type(pair_ty))
            b_t = tl.load(p_t + i_hv * K * K + o_k[:, None] * K + o_k[None, :],
                          mask=m_k[:, None] & m_k[None, :] & has, other=0.0)  # fmt: skip
            if FAST:  # fp32 pairs only (see wy_chain_triton)
                b_h = tl.where(has, _state_dot(b_t, b_h, FAST) + b_s, b_h)
            else:
                b_h = tl.where(has, pair_step(b_t, b_h, b_s, SPLIT, False), b_h)
        else:
            b_h = b_h + b_s
    tl.store(ht + i_hv * K * V + off_kv, b_h, mask=m_kv)


Factors = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def wy_factors_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    chunks: torch.Tensor,
    chunk_size: int,
    *,
    use_qk_l2norm: bool = True,
    scale: float | None = None,
    num_warps: int | None = None,
) -> Factors:
    """q, k ``[T, H, K]``, v ``[T, HV, V]``, g, beta ``[T, HV]``, chunks ``[NC, 2]`` int32 (each at
    most ``chunk_size`` tokens) -> (w, kd, qp ``[T, HV, K]``, u, ol ``[T, HV, V]``, gam ``[NC, HV]``)
    fp32 (see module doc; rows outside every chunk are left unset)."""
    T, H, K = k.shape
    HV, V = v.shape[1], v.shape[2]
    # q, k, v may be row-strided views (the conv output split into heads): no copies
    q, k, v = (x if x.stride()[1:] == (x.shape[2], 1) else x.contiguous() for x in (q, k, v))
    if q.stride(0) != k.stride(0):
        q, k = q.contiguous(), k.contiguous()
    g, beta = g.contiguous(), beta.contiguous()
    dev = v.device
    w, kd, qp = (torch.empty(T, HV, K, dtype=torch.float32, device=dev) for _ in range(3))
    u, ol = (torch.empty(T, HV, V, dtype=torch.float32, device=dev) for _ in range(2))
    nc = chunks.shape[0]
    gam = torch.empty(nc, HV, dtype=torch.float32, device=dev)
    if nc:
        BT = max(16, triton.next_power_of_2(chunk_size))
        _wy_factors_kernel[(nc, HV)](
            q, k, v, g, beta, chunks, w, kd, qp, u, ol, gam, K**-0.5 if scale is None else scale, k.stride(0),
            v.stride(0), H=H, HV=HV, K=K, V=V, BK=max(16, triton.next_power_of_2(K)),
            BV=max(16, triton.next_power_of_2(V)), BT=BT, L2NORM=use_qk_l2norm,
            num_warps=num_warps or (4 if BT <= 16 else 8),
        )  # fmt: skip
    return w, kd, qp, u, ol, gam


_CHAIN_CONFIGS = [
    triton.Config({"BV": bv, "STAGES": st}, num_warps=nw)
    for bv, nw in ((16, 4), (32, 4), (32, 8), (64, 8))  # 16 warps: 3-4x slower (on the H200)
    for st in (1, 2)
]
_tuned_chain = triton.autotune(configs=_CHAIN_CONFIGS, key=["HV", "K", "V", "BT", "PAIR_BF16", "TRANSITION", "FAST"],
                               **autotune_cache())(_wy_chain_kernel)  # fmt: skip


def wy_chain_triton(
    factors: Factors,
    meta: torch.Tensor,
    ptrs: torch.Tensor,
    h0: torch.Tensor,
    out_dtype: torch.dtype,
    chunk_size: int,
    *,
    pair_dtype: torch.dtype = torch.float32,
    transition: bool = True,
    bv: int | None = None,
    num_warps: int | None = None,
    stages: int = 2,
    precise: bool | None = None,
    bounds: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``factors`` (``wy_factors_triton``), meta ``[NS, 4]`` int32 and ptrs ``[NS, 2]`` int64
    (``combine_scan_plan.WYSteps``), h0 ``[HV, K, V]`` -> (o ``[T, HV, V]`` in ``out_dtype``, final state
    ``[HV, K, V]`` fp32). Launch: autotuned (value columns per program, warps, pipeline stages) unless
    ``bv`` is given, then ``num_warps`` and ``stages`` of software pipelining over the steps.

    ``bounds``: ``[N+1]`` int32 on the device, the steps of N independent chains (``WYSteps.bounds``;
    several requests' combines of one forward, ``combine_scan_plan.merge_steps``), run side by side
    with h0 ``[N, HV, K, V]`` -> final states ``[N, HV, K, V]``; None: one chain over all the steps
    (a small host->device copy: the dispatcher passes its plan's ``bounds``).

    ``precise``: the state's dots in tf32x3 (about fp32) or in one tf32 pass; None: one pass when
    ``out_dtype`` is bf16 / fp16 (``KernelConfig.precise_for_half`` off), else precise. bf16 pairs
    always run precise."""
    if pair_dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"pairs must be float32 or bfloat16, got {pair_dtype}")
    w, kd, qp, u, ol, gam = factors
    HV, K, V = h0.shape[-3:]
    T = u.shape[0]
    if bounds is None:
        if h0.dim() != 3:
            raise ValueError(f"one chain needs h0 [HV, K, V], got {tuple(h0.shape)} (several: pass bounds)")
        bounds = to_device_async(torch.tensor([0, meta.shape[0]], dtype=torch.int32), meta.device)
    n = bounds.shape[0] - 1
    if h0.shape[:-3] not in ((), (n,)) or (h0.dim() == 3 and n != 1):
        raise ValueError(f"{n} chains need h0 [{n}, HV, K, V], got {tuple(h0.shape)}")
    o = torch.empty(T, HV, V, dtype=out_dtype, device=h0.device)
    ht = torch.empty(h0.shape, dtype=torch.float32, device=h0.device)
    args = (w, kd, qp, u, ol, gam, o, h0.float().contiguous(), ht, meta, ptrs, bounds)
    bf16 = pair_dtype == torch.bfloat16
    BT = max(16, triton.next_power_of_2(chunk_size))
    if precise is None:
        precise = out_dtype not in (torch.bfloat16, torch.float16)
    # NOTE: bf16 pairs keep the precise dots: with one-pass chunk dots next to the split bf16 pair
    # dots, one of the autotuned launch shapes (64-token chunks) hit an illegal address on the H200
    # (Triton 3.6); their pair product is two bf16 passes either way.
    precise = precise or bf16
    consts = dict(HV=HV, K=K, V=V, BK=max(16, triton.next_power_of_2(K)), BT=BT, TRANSITION=transition, PAIR_BF16=bf16,
                  SPLIT=bf16 and not interpreting(), FAST=not precise)  # fmt: skip

    if bv is None:
        _tuned_chain[lambda m: (triton.cdiv(V, m["BV"]), HV, n)](*args, **consts)
    else:
        BV = max(16, min(bv, triton.next_power_of_2(V)))
        _wy_chain_kernel[(triton.cdiv(V, BV), HV, n)](*args, **consts, BV=BV, STAGES=stages, num_warps=num_warps or 4)
    return o, ht
