"""Fused combine scan in Triton (CUDA; imported lazily). Twin: ``combine_scan.gdn_combine_scan_torch``.

Grid ``(cdiv(V, BV), HV)``: each program owns a ``[K, BV]`` column slice of one value head's state
and walks the chain. Piece tokens run the gated delta rule one step at a time (decay, delta
update, output). A token step is latency-bound: ``_prep_qk_kernel`` first normalises q and k and
computes ``q^T k`` for every token in one launch (no cross-thread reductions left for them in the
loop), the next token's operands are loaded before this one computes, and the output comes from
the previous state (``q^T h' = a q^T h + (q^T k) d``): one round of reductions over K per token,
not two. A body loads its ``T`` / ``S`` through the
pointer table and applies ``h <- T @ h + S`` as one ``[K, K] x [K, BV]`` tensor-core dot in
``tf32x3`` (about fp32 accuracy, as in ``chain_triton``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .backend import autotune_cache


@triton.jit
def _gdn_combine_scan_kernel(
    q, k, qk, v, g, beta, o, h0, ht, meta, ptrs, n, scratch,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    BC: tl.constexpr, TRANSITION: tl.constexpr, PAIR_BF16: tl.constexpr,
):  # fmt: skip
    """q, k ``[T, H, K]`` fp32 prepared by ``_prep_qk_kernel`` (normalised, q scaled), qk ``[T, H]``."""
    i_v = tl.program_id(0)
    i_hv = tl.program_id(1).to(tl.int64)
    i_h = i_hv // (HV // H)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
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
            # token t+1's operands are loaded while token t computes (they do not depend on the state)
            live = start < end
            b_q = tl.load(q + (i_h + start * H) * K + o_k, mask=m_k & live, other=0.0)
            b_k = tl.load(k + (i_h + start * H) * K + o_k, mask=m_k & live, other=0.0)
            b_qk = tl.load(qk + i_h + start * H, mask=live, other=0.0)
            b_v = tl.load(v + (i_hv + start * HV) * V + o_v, mask=m_v & live, other=0.0).to(tl.float32)
            b_g = tl.load(g + i_hv + start * HV, mask=live, other=0.0).to(tl.float32)
            b_beta = tl.load(beta + i_hv + start * HV, mask=live, other=0.0).to(tl.float32)
            for t in range(start, end):
                nxt = t + 1 < end
                n_q = tl.load(q + (i_h + (t + 1) * H) * K + o_k, mask=m_k & nxt, other=0.0)
                n_k = tl.load(k + (i_h + (t + 1) * H) * K + o_k, mask=m_k & nxt, other=0.0)
                n_qk = tl.load(qk + i_h + (t + 1) * H, mask=nxt, other=0.0)
                n_v = tl.load(v + (i_hv + (t + 1) * HV) * V + o_v, mask=m_v & nxt, other=0.0)
                n_g = tl.load(g + i_hv + (t + 1) * HV, mask=nxt, other=0.0)
                n_beta = tl.load(beta + i_hv + (t + 1) * HV, mask=nxt, other=0.0)
                # h' = a h + k d^T with d = (v - a k^T h) beta, so q^T h' = a q^T h + (q^T k) d:
                # both reductions over K read the previous state and run side by side
                decay = tl.exp(b_g)
                b_hk = tl.sum(b_h * b_k[:, None], 0)
                b_hq = tl.sum(b_h * b_q[:, None], 0)
                b_d = (b_v - decay * b_hk) * b_beta
                b_o = decay * b_hq + b_qk * b_d
                b_h = b_h * decay + b_k[:, None] * b_d[None, :]
                tl.store(o + (i_hv + t * HV) * V + o_v, b_o.to(o.dtype.element_ty), mask=m_v)
                b_q, b_k, b_qk, b_v = n_q, n_k, n_qk, n_v.to(tl.float32)
                b_g, b_beta = n_g.to(tl.float32), n_beta.to(tl.float32)
        else:
            p_s = tl.load(ptrs + i * 2 + 1).to(tl.pointer_type(pair_ty))
            b_s = tl.load(p_s + i_hv * K * V + off_kv, mask=m_kv, other=0.0).to(tl.float32)
            if TRANSITION:
                p_t = tl.load(ptrs + i * 2).to(tl.pointer_type(pair_ty))
                if BC == 0:  # the whole [K, K] tile in registers, one tf32x3 dot
                    b_t = tl.load(p_t + i_hv * K * K + o_k[:, None] * K + o_k[None, :],
                                  mask=m_k[:, None] & m_k[None, :], other=0.0).to(tl.float32)  # fmt: skip
                    b_h = tl.dot(b_t, b_h, input_precision="tf32x3") + b_s
                else:  # T streamed in [K, BC] column blocks against h re-read from an L2-hot scratch copy
                    tl.store(scratch + i_hv * K * V + off_kv, b_h, mask=m_kv)
                    tl.debug_barrier()
                    acc = b_s
                    for c in tl.static_range(0, BK, BC):
                        o_c = c + tl.arange(0, BC)
                        m_c = o_c < K
                        b_t = tl.load(p_t + i_hv * K * K + o_k[:, None] * K + o_c[None, :],
                                      mask=m_k[:, None] & m_c[None, :], other=0.0).to(tl.float32)  # fmt: skip
                        b_hc = tl.load(scratch + i_hv * K * V + o_c[:, None] * V + o_v[None, :],
                                       mask=m_c[:, None] & m_v[None, :], other=0.0)  # fmt: skip
                        acc += tl.dot(b_t, b_hc, input_precision="tf32x3")
                    tl.debug_barrier()  # every thread has read h before the next body overwrites it
                    b_h = acc
            else:
                b_h = b_h + b_s
    tl.store(ht + i_hv * K * V + off_kv, b_h, mask=m_kv)


@triton.jit
def _prep_qk_kernel(q, k, qo, ko, qk, scale, H: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, L2NORM: tl.constexpr):
    """One (token, key head): q, k ``[T, H, K]`` -> L2-normalised fp32 copies (q times ``scale``) and
    their dot ``qk [T, H]`` (the scan's per-token ``q^T k``)."""
    i_t = tl.program_id(0).to(tl.int64)
    i_h = tl.program_id(1)
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    off = (i_t * H + i_h) * K + o_k
    b_q = tl.load(q + off, mask=m_k, other=0.0).to(tl.float32)
    b_k = tl.load(k + off, mask=m_k, other=0.0).to(tl.float32)
    if L2NORM:
        b_q = b_q * (1.0 / tl.sqrt(tl.sum(b_q * b_q) + 1e-6))
        b_k = b_k * (1.0 / tl.sqrt(tl.sum(b_k * b_k) + 1e-6))
    b_q = b_q * scale
    tl.store(qo + off, b_q, mask=m_k)
    tl.store(ko + off, b_k, mask=m_k)
    tl.store(qk + i_t * H + i_h, tl.sum(b_q * b_k))


_CONFIGS = [
    triton.Config({"BV": bv, "BC": bc}, num_warps=nw)
    for bv, nw, bc in ((32, 4, 0), (16, 4, 0), (16, 2, 32), (16, 1, 16), (32, 2, 32), (64, 4, 32))
]
_tuned_kernel = triton.autotune(configs=_CONFIGS, key=["H", "HV", "K", "V", "PAIR_BF16"], **autotune_cache())(
    _gdn_combine_scan_kernel
)


def gdn_combine_scan_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    meta: torch.Tensor,
    ptrs: torch.Tensor,
    h0: torch.Tensor,
    *,
    pair_dtype: torch.dtype = torch.float32,
    use_qk_l2norm: bool = True,
    scale: float | None = None,
    transition: bool = True,
    bv: int | None = None,
    num_warps: int = 4,
    body_chunk: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k ``[T, H, K]``, v ``[T, HV, V]``, g, beta ``[T, HV]``, meta ``[n, 3]`` int32, ptrs
    ``[n, 2]`` int64 (``combine_scan.chain_tables``), h0 ``[HV, K, V]`` -> (o ``[T, HV, V]``, final
    ``[HV, K, V]`` fp32). Launch shape: autotuned over ``_CONFIGS`` (cached with Triton's cache)
    unless ``bv`` is given; then ``bv`` value columns per program, ``num_warps``, and ``body_chunk``
    (0: whole ``[K, K]`` tile per body; else column blocks of that width)."""
    if pair_dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"pairs must be float32 or bfloat16, got {pair_dtype}")
    H, K = k.shape[1], k.shape[2]
    HV, V = v.shape[1], v.shape[2]
    q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
    T = k.shape[0]
    BK = max(16, triton.next_power_of_2(K))
    qs = torch.empty(T, H, K, dtype=torch.float32, device=v.device)
    ks = torch.empty_like(qs)
    qk = torch.empty(T, H, dtype=torch.float32, device=v.device)
    if T:
        _prep_qk_kernel[(T, H)](q, k, qs, ks, qk, K**-0.5 if scale is None else scale, H=H, K=K, BK=BK,
                                L2NORM=use_qk_l2norm)  # fmt: skip
    o = torch.empty_like(v)
    ht = torch.empty(HV, K, V, dtype=torch.float32, device=v.device)
    scratch = torch.empty(HV, K, V, dtype=torch.float32, device=v.device)  # body_chunk > 0: h re-read from here
    args = (qs, ks, qk, v, g, beta, o, h0.float().contiguous(), ht, meta, ptrs, meta.shape[0], scratch)
    consts = dict(H=H, HV=HV, K=K, V=V, BK=BK, TRANSITION=transition, PAIR_BF16=pair_dtype == torch.bfloat16)
    if bv is None:
        _tuned_kernel[lambda meta: (triton.cdiv(V, meta["BV"]), HV)](*args, **consts)
    else:
        BV = max(16, min(bv, triton.next_power_of_2(V)))
        _gdn_combine_scan_kernel[(triton.cdiv(V, BV), HV)](*args, **consts, BV=BV, BC=body_chunk, num_warps=num_warps)
    return o, ht
