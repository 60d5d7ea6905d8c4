"""Fused chain scan in Triton (CUDA; imported lazily so CPU installs never need triton). Twins:
``chain_torch``.

One launch, grid ``(cdiv(V, BV), HV)``: each program owns a ``[K, BV]`` column slice of the
running state and walks the n pairs, ``h <- T[i] @ h + S[i]``, storing every state. Two
variants (``CHUNKED``):

* full tile: ``h`` stays in registers, one ``tl.dot(T[i], h)`` per step in ``tf32x3``
  (three tensor-core passes, ~fp32 accuracy; the precision fla uses for its CP chains);
* chunked: ``T[i]`` is streamed in ``[K, BC]`` column blocks and the previous state is re-read
  from the output (L1/L2-hot, after a CTA barrier), exact fp32 FMA dots (``ieee``).

bf16 pairs on the full tile take two bf16 tensor-core passes instead of tf32x3: ``T`` is exact in
bf16, and the fp32 state is split into ``hi + lo`` bf16 halves (``T h = T hi + T lo``, ~16
mantissa bits of ``h``, fp32 accumulation). ``LAST_ONLY`` keeps the state in registers and stores
only the final one (a ``w = 0`` request needs nothing else): the scan then reads the pairs once
and writes ``[HV, K, V]``, so it runs at the pairs' read bandwidth.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..backend import interpreting


@triton.jit
def pair_step(b_t, b_h, b_s, SPLIT: tl.constexpr, ONE_PASS: tl.constexpr):
    """One pair on a state block: ``T [K, K] @ h [K, BV] + S`` -> fp32 ``[K, BV]``. ``SPLIT`` (bf16 ``T``,
    which is exact in bf16): two bf16 dots over ``h = hi + lo`` (~16 of its bits), or one over ``hi``
    with ``ONE_PASS``; else ``T`` in fp32 and one tf32x3 dot (about fp32)."""
    if SPLIT:
        h_hi = b_h.to(tl.bfloat16)
        h_lo = (b_h - h_hi.to(tl.float32)).to(tl.bfloat16)  # dead code with ONE_PASS
        out = tl.dot(b_t, h_hi, b_s)
        if not ONE_PASS:
            out = tl.dot(b_t, h_lo, out)
        return out
    else:
        return tl.dot(b_t.to(tl.float32), b_h, input_precision="tf32x3") + b_s


@triton.jit
def _chain_scan_kernel(
    h0, t, s, out, n,
    HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    BC: tl.constexpr, CHUNKED: tl.constexpr, STAGES: tl.constexpr, LAST_ONLY: tl.constexpr,
    T_BF16: tl.constexpr, ONE_PASS: tl.constexpr,
):  # fmt: skip
    i_v = tl.program_id(0)
    i_h = tl.program_id(1).to(tl.int64)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    off_kv = o_k[:, None] * V + o_v[None, :]
    b_h = tl.load(h0 + i_h * K * V + off_kv, mask=m_kv, other=0.0).to(tl.float32)
    if not LAST_ONLY:
        tl.store(out + i_h * K * V + off_kv, b_h, mask=m_kv)
    for i in tl.range(0, n, num_stages=STAGES):
        base = i * HV + i_h
        b_s = tl.load(s + base * K * V + off_kv, mask=m_kv, other=0.0).to(tl.float32)
        if CHUNKED:
            tl.debug_barrier()  # out[i] written by this CTA must be visible to all its threads
            acc = b_s
            for c in tl.static_range(0, BK, BC):
                o_c = c + tl.arange(0, BC)
                m_c = o_c < K
                b_t = tl.load(t + base * K * K + o_k[:, None] * K + o_c[None, :], mask=m_k[:, None] & m_c[None, :],
                              other=0.0).to(tl.float32)  # fmt: skip
                b_hc = tl.load(out + base * K * V + o_c[:, None] * V + o_v[None, :], mask=m_c[:, None] & m_v[None, :],
                               other=0.0)  # fmt: skip
                acc += tl.dot(b_t, b_hc, input_precision="ieee")
            tl.store(out + (base + HV) * K * V + off_kv, acc, mask=m_kv)
        else:
            b_t = tl.load(t + base * K * K + o_k[:, None] * K + o_k[None, :], mask=m_k[:, None] & m_k[None, :],
                          other=0.0)  # fmt: skip
            b_h = pair_step(b_t, b_h, b_s, T_BF16, ONE_PASS)
            if not LAST_ONLY:
                tl.store(out + (base + HV) * K * V + off_kv, b_h, mask=m_kv)
    if LAST_ONLY:
        tl.store(out + i_h * K * V + off_kv, b_h, mask=m_kv)


def chain_scan_triton(
    h0: torch.Tensor, T: torch.Tensor, S: torch.Tensor, *, chunked: bool = False, last_only: bool = False,
    state_bf16: bool = False, bv: int | None = None, num_warps: int | None = None, stages: int | None = None,
) -> torch.Tensor:  # fmt: skip
    """h0 ``[HV, K, V]``, T ``[n, HV, K, K]``, S ``[n, HV, K, V]`` (CUDA) -> ``[n+1, HV, K, V]`` fp32
    (``last_only``: the final state ``[HV, K, V]``; full tile only). ``state_bf16`` (bf16 pairs): one
    bf16 dot per pair with the state rounded to bf16 for the product (fp32 accumulation), instead of
    the hi/lo pair of dots: 30 layers x 64 pairs x 32 heads on the H200 0.98 ms against 1.25 ms, at
    8.4e-4 relative error against the fp32 chain over the same pairs (storing the pairs in bf16
    already costs ~2e-3); the default keeps 1.4e-6.

    ``stages``: software pipelining of the pair loop (the next T / S load overlaps this step's dot);
    default for the full tile 2 with fp32 pairs (measured on the H200 at 30 layers x 64 pairs x 32
    heads of 128 x 128: about a quarter faster, identical results; 3 stages exceed shared memory) and
    3 with bf16 pairs (``last_only`` with ``state_bf16``; 4 exceed shared memory at 128 columns), 1
    for the chunked variant (its CTA barrier orders re-reads of the output).

    T and S are read in their stored dtype (fp32 or bf16 pairs) and converted in registers: no
    upcast copy of the pairs (for 30 layers x 64 bf16 pairs that copy alone wrote 8 GB).

    Default launch: full tile 64 value columns per program with 8 warps (H200, 64 pairs x 192 heads
    of 128 x 128: 1.39 ms against 3.28 ms for 32 columns / 4 warps; 128 columns exceed shared
    memory); the chunked variant keeps 32 / 4."""
    HV, K, V = h0.shape
    n = T.shape[0]
    h0 = h0.float().contiguous()
    T, S = (x.contiguous() if x.dtype in (torch.float32, torch.bfloat16, torch.float16) else x.float() for x in (T, S))
    if last_only and chunked:
        raise ValueError("last_only needs the full-tile variant (chunked=False)")
    out = torch.empty(*(() if last_only else (n + 1,)), HV, K, V, dtype=torch.float32, device=h0.device)
    BK = max(16, triton.next_power_of_2(K))
    BV = bv or max(16, min(32 if chunked else 64, triton.next_power_of_2(V)))
    warps = num_warps or (8 if BV >= 64 else 4)
    grid = (triton.cdiv(V, BV), HV)
    _chain_scan_kernel[grid](
        h0,
        T,
        S,
        out,
        n,
        HV=HV,
        K=K,
        V=V,
        BK=BK,
        BV=BV,
        BC=min(BK, 32),
        CHUNKED=chunked,
        STAGES=stages or (1 if chunked else 3 if T.dtype == torch.bfloat16 else 2),
        LAST_ONLY=last_only,
        T_BF16=T.dtype == torch.bfloat16 and not chunked and not interpreting(),
        ONE_PASS=state_bf16,
        num_warps=warps,
    )
    return out


@triton.jit
def _chain_pointers_kernel(
    ptrs, out, n,
    HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PAIR_TY: tl.constexpr,
    TRANSITION: tl.constexpr, SPLIT: tl.constexpr, STAGES: tl.constexpr,
):  # fmt: skip
    """Grid ``(cdiv(V, BV), L * HV)``: chain ``l``'s pairs read through ``ptrs [L, n, 2]`` (T, S data
    pointers), from a zero state (the first pair's T is never read); the final state -> ``out [L, HV, K, V]``."""
    i_v = tl.program_id(0)
    i_lh = tl.program_id(1).to(tl.int64)
    i_l = i_lh // HV
    i_hv = i_lh % HV
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    off_kv = i_hv * K * V + o_k[:, None] * V + o_v[None, :]
    p_s0 = tl.load(ptrs + i_l * n * 2 + 1).to(tl.pointer_type(PAIR_TY))
    b_h = tl.load(p_s0 + off_kv, mask=m_kv, other=0.0).to(tl.float32)
    for i in tl.range(1, n, num_stages=STAGES):
        p_s = tl.load(ptrs + (i_l * n + i) * 2 + 1).to(tl.pointer_type(PAIR_TY))
        b_s = tl.load(p_s + off_kv, mask=m_kv, other=0.0).to(tl.float32)
        if TRANSITION:
            p_t = tl.load(ptrs + (i_l * n + i) * 2).to(tl.pointer_type(PAIR_TY))
            b_t = tl.load(p_t + i_hv * K * K + o_k[:, None] * K + o_k[None, :], mask=m_k[:, None] & m_k[None, :],
                          other=0.0)  # fmt: skip
            b_h = pair_step(b_t, b_h, b_s, SPLIT, False)
        else:
            b_h = b_h + b_s
    tl.store(out + i_l * HV * K * V + off_kv, b_h, mask=m_kv)


def chain_pointers_triton(
    ptrs: torch.Tensor, hv: int, k: int, v: int, pair_dtype: torch.dtype, *, transition: bool = True
) -> torch.Tensor:
    """ptrs ``[L, n, 2]`` int64 (CUDA): the data pointers of L chains' n pairs (T ``[HV, K, K]``, S
    ``[HV, K, V]``, contiguous, ``pair_dtype``) -> each chain's state from zero after all its pairs,
    ``[L, HV, K, V]`` fp32 (``transition=False``: the sum of the S, the ``addition`` ablation). One
    launch for every chain: the bodies at the head of a ``w = 0`` prompt, for all linear layers."""
    L, n = ptrs.shape[0], ptrs.shape[1]
    if n == 0:
        raise ValueError("need at least one pair per chain")
    out = torch.empty(L, hv, k, v, dtype=torch.float32, device=ptrs.device)
    BK = max(16, triton.next_power_of_2(k))
    BV = max(16, min(64, triton.next_power_of_2(v)))
    bf16 = pair_dtype == torch.bfloat16
    pair_ty = tl.bfloat16 if bf16 else tl.float16 if pair_dtype == torch.float16 else tl.float32
    _chain_pointers_kernel[(triton.cdiv(v, BV), L * hv)](
        ptrs.contiguous(), out, n, HV=hv, K=k, V=v, BK=BK, BV=BV, PAIR_TY=pair_ty, TRANSITION=transition,
        SPLIT=bf16 and not interpreting(), STAGES=3 if bf16 else 2, num_warps=8 if BV >= 64 else 4,
    )  # fmt: skip
    return out
