"""Combine scan with pieces in chunk (WY) form (CUDA; fla-core + Triton; imported lazily).

Twin: ``combine_scan.gdn_combine_scan_torch`` (token loop, fp32): the same recurrence, reordered.

The token-loop scan (``combine_scan_triton``) walks every active token of a piece one step at a time:
for 20 seam windows of 8 tokens plus a 50-token question that is 210 dependent steps per layer, each
a round of reductions over K. Here the parts of a piece that do not depend on the running state run
first, in parallel, through fla's own kernels over the pieces as varlen sequences: L2-normalised q, k,
the chunk-local cumulative decay ``gc`` (log2 space) and the WY factors ``w, u``. The scan then takes
a piece 64 tokens at a time with a handful of tensor-core dots against the entering state ``h [K, BV]``::

    v' = u - w h                                  [BT, BV]   (the delta values)
    o  = scale (exp2(gc) * (q h) + (M * q k^T) v')           M[i, j] = exp2(gc_i - gc_j) for j <= i
    h  = exp2(gc_last) h + k^T (exp2(gc_last - gc) * v')

(fla's ``chunk_gated_delta_rule_fwd_h`` / ``chunk_fwd_o`` for one chunk). fla rounds the state to
the inputs' dtype for its dots; here the fp32 state (and the delta values) are split into bf16
``hi + lo`` halves, two bf16 dots each, so the running state keeps about fp32 accuracy over the
whole chain as in the token loop (fp32 inputs take tf32x3 dots). A body applies its pair as in the token-loop kernel:
``h <- T h + S``, one tf32x3 dot for fp32 pairs or two bf16 dots over a hi/lo split of ``h`` for
bf16 pairs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from .backend import interpreting
from .chain_triton import pair_step

BT = 64  # fla's chunk: the WY factors are chunk-local over 64 tokens from each piece's start
Factors = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


@triton.jit
def _dot_f32(a, b, SPLIT: tl.constexpr):
    """``a [M, K]`` (the inputs' dtype) times fp32 ``b [K, N]`` -> fp32 at about fp32 accuracy: bf16
    inputs split ``b`` into bf16 ``hi + lo`` (two bf16 dots), fp32 inputs take one tf32x3 dot."""
    if SPLIT:
        hi = b.to(a.dtype)
        return tl.dot(a, (b - hi.to(tl.float32)).to(a.dtype), tl.dot(a, hi))
    else:
        return tl.dot(a.to(tl.float32), b, input_precision="tf32x3")


@triton.jit
def _chunked_scan_kernel(
    q, k, w, u, gc, o, h0, ht, meta, ptrs, n, scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    CH: tl.constexpr, TRANSITION: tl.constexpr, PAIR_BF16: tl.constexpr, SPLIT: tl.constexpr,
    SPLIT_IN: tl.constexpr,
):  # fmt: skip
    """q, k ``[T, H, K]`` normalised; w ``[T, HV, K]``, u ``[T, HV, V]``, gc ``[T, HV]`` fp32 (fla's, over
    the pieces); o ``[T, HV, V]``; h0, ht ``[HV, K, V]`` fp32; meta ``[n, 3]``, ptrs ``[n, 2]``."""
    i_v = tl.program_id(0)
    i_hv = tl.program_id(1).to(tl.int64)
    i_h = i_hv // (HV // H)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    o_c = tl.arange(0, CH)
    m_k = o_k < K
    m_v = o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    off_kv = o_k[:, None] * V + o_v[None, :]
    b_h = tl.load(h0 + i_hv * K * V + off_kv, mask=m_kv, other=0.0).to(tl.float32)
    pair_ty = tl.bfloat16 if PAIR_BF16 else tl.float32
    for i in range(n):
        kind = tl.load(meta + i * 3)
        if kind == 0:
            start = tl.load(meta + i * 3 + 1)
            end = tl.load(meta + i * 3 + 2)
            for c in range(start, end, CH):
                rows = (c + o_c).to(tl.int64)
                m_t = rows < end
                m_tk = m_t[:, None] & m_k[None, :]
                m_tv = m_t[:, None] & m_v[None, :]
                b_q = tl.load(q + (rows[:, None] * H + i_h) * K + o_k[None, :], mask=m_tk, other=0.0)
                b_k = tl.load(k + (rows[:, None] * H + i_h) * K + o_k[None, :], mask=m_tk, other=0.0)
                b_w = tl.load(w + (rows[:, None] * HV + i_hv) * K + o_k[None, :], mask=m_tk, other=0.0)
                b_u = tl.load(u + (rows[:, None] * HV + i_hv) * V + o_v[None, :], mask=m_tv, other=0.0)
                b_g = tl.load(gc + rows * HV + i_hv, mask=m_t, other=0.0)
                last = tl.minimum(c + CH, end) - 1
                g_last = tl.load(gc + last.to(tl.int64) * HV + i_hv)
                b_d = b_u.to(tl.float32) - _dot_f32(b_w, b_h, SPLIT_IN)  # [CH, BV] delta values
                b_o = _dot_f32(b_q, b_h, SPLIT_IN) * tl.exp2(b_g)[:, None]
                b_a = tl.dot(b_q, tl.trans(b_k)) * tl.exp2(b_g[:, None] - b_g[None, :])
                b_a = tl.where((o_c[:, None] >= o_c[None, :]) & m_t[:, None] & m_t[None, :], b_a, 0.0)
                b_o = (b_o + _dot_f32(b_a.to(b_q.dtype), b_d, SPLIT_IN)) * scale
                tl.store(o + (rows[:, None] * HV + i_hv) * V + o_v[None, :], b_o.to(o.dtype.element_ty), mask=m_tv)
                b_ds = b_d * tl.where(m_t, tl.exp2(g_last - b_g), 0.0)[:, None]
                b_h = b_h * tl.exp2(g_last) + _dot_f32(tl.trans(b_k), b_ds, SPLIT_IN)
        else:
            p_s = tl.load(ptrs + i * 2 + 1).to(tl.pointer_type(pair_ty))
            b_s = tl.load(p_s + i_hv * K * V + off_kv, mask=m_kv, other=0.0).to(tl.float32)
            if TRANSITION:
                p_t = tl.load(ptrs + i * 2).to(tl.pointer_type(pair_ty))
                b_t = tl.load(p_t + i_hv * K * K + o_k[:, None] * K + o_k[None, :], mask=m_k[:, None] & m_k[None, :],
                              other=0.0)  # fmt: skip
                b_h = pair_step(b_t, b_h, b_s, SPLIT, False)
            else:
                b_h = b_h + b_s
    tl.store(ht + i_hv * K * V + off_kv, b_h, mask=m_kv)


def piece_factors_fla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_pieces: torch.Tensor,
    piece_chunks: torch.Tensor,
    use_qk_l2norm: bool,
) -> Factors:
    """The state-independent part of every piece, through fla over the pieces as packed sequences:
    q, k ``[T, H, K]`` (L2-normalised), w ``[T, HV, K]``, u ``[T, HV, V]``, gc ``[T, HV]`` fp32
    (chunk-local cumulative log2 decay)."""
    from fla.modules.norm.l2norm import l2norm_fwd
    from fla.ops.gated_delta_rule.chunk_fwd import chunk_gated_delta_rule_fwd_intra
    from fla.ops.utils import chunk_local_cumsum
    from fla.ops.utils.constant import RCP_LN2

    qn, kn = (l2norm_fwd(x.contiguous())[0] if use_qk_l2norm else x.contiguous() for x in (q, k))
    gc = chunk_local_cumsum(g.float()[None].contiguous(), chunk_size=BT, scale=RCP_LN2, cu_seqlens=cu_pieces,
                            chunk_indices=piece_chunks)  # fmt: skip
    w, u, _ = chunk_gated_delta_rule_fwd_intra(
        k=kn[None], v=v.contiguous()[None], g=gc, beta=beta.to(kn.dtype)[None].contiguous(), cu_seqlens=cu_pieces,
        chunk_size=BT, chunk_indices=piece_chunks,
    )  # fmt: skip
    return qn, kn, w[0], u[0], gc[0]


def gdn_combine_scan_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    meta: torch.Tensor,
    ptrs: torch.Tensor,
    h0: torch.Tensor,
    cu_pieces: torch.Tensor,
    piece_chunks: torch.Tensor,
    *,
    pair_dtype: torch.dtype = torch.float32,
    use_qk_l2norm: bool = True,
    scale: float | None = None,
    transition: bool = True,
    bv: int = 32,
    num_warps: int = 4,
    factors: Callable[..., Factors] = piece_factors_fla,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k ``[T, H, K]``, v ``[T, HV, V]``, g, beta ``[T, HV]``, meta ``[n, 3]`` int32, ptrs ``[n, 2]``
    int64, h0 ``[HV, K, V]``; ``cu_pieces [P+1]`` int64 the pieces as packed sequences and
    ``piece_chunks [NC, 2]`` fla's chunk indices for them (``ChainTables``) -> (o ``[T, HV, V]``,
    final ``[HV, K, V]`` fp32). Launch: ``bv`` value columns per program, ``num_warps``.
    ``factors``: ``piece_factors_fla`` (or a twin with its signature: the CPU interpreter test's)."""
    if pair_dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"pairs must be float32 or bfloat16, got {pair_dtype}")
    if k.dtype not in (torch.bfloat16, torch.float16) and not interpreting():
        # fp32 tiles need 247 KB of shared memory at 32 value columns (sm_90 has 227 KB; 16 columns
        # fit at 223 KB, unmeasured): the dispatcher keeps fp32 on the token loop, and the CPU
        # interpreter test runs this kernel in fp32
        raise ValueError(f"the chunked combine scan takes bf16/fp16 q, k, v on the GPU, got {k.dtype}")
    T, H, K = k.shape
    HV, V = v.shape[1], v.shape[2]
    o = torch.empty_like(v)
    ht = torch.empty(HV, K, V, dtype=torch.float32, device=v.device)
    if T:
        qn, kn, w, u, gc = factors(q, k, v, g, beta, cu_pieces, piece_chunks, use_qk_l2norm)
    else:
        qn, kn, w, u, gc = q, k, k.new_empty(0, HV, K), v, g.float()
    BK = max(16, triton.next_power_of_2(K))
    BV = max(16, min(bv, triton.next_power_of_2(V)))
    _chunked_scan_kernel[(triton.cdiv(V, BV), HV)](
        qn, kn, w, u, gc, o, h0.float().contiguous(), ht, meta, ptrs, meta.shape[0],
        K**-0.5 if scale is None else scale, H=H, HV=HV, K=K, V=V, BK=BK, BV=BV, CH=BT, TRANSITION=transition,
        PAIR_BF16=pair_dtype == torch.bfloat16, SPLIT=pair_dtype == torch.bfloat16 and not interpreting(),
        SPLIT_IN=kn.dtype in (torch.bfloat16, torch.float16) and not interpreting(),
        num_warps=num_warps,
    )  # fmt: skip
    return o, ht
