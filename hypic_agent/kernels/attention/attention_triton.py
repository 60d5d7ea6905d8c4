"""Split-K attention for a few queries over many keys, in Triton (CUDA; imported lazily).
Twin: ``attention_torch.sdpa_positions`` (SDPA with a position mask).

Combine runs a few hundred active queries over the whole spliced prompt (20k keys). SDPA needs an
explicit ``[Tq, Tk]`` mask there (no flash path), repeats K/V for GQA, and launches only about
``Tq / 64 x Hq`` CTAs. Here:

* the GQA group rides in the rows: a program owns ``BM`` rows, each a (query, head-in-group) pair
  of one kv head, so K/V are read once per group and never repeated;
* the keys are split in ``NS`` ranges (flash-decoding): grid ``(cdiv(Tq * G, BM), Hkv, NS)``;
  each program writes a partial output and its log-sum-exp, a second kernel merges them;
* the causal rule ``k_pos <= q_pos`` is applied in the kernel from the position vectors, and a
  key block no row of the program sees is skipped. With ascending key positions (combine's
  spliced prompt: the caller says so) those are the blocks after a prefix, counted before the
  loop from the blocks' first keys; the loop then has no branch and is software-pipelined (the
  next block's K/V load runs under this block's dots).

Rows that see no key get zeros, as in the twin.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ..backend import autotune_cache


@triton.jit
def _key_block(b_q, k, v, kpos, b_qp, start, k_hi, i_hk, scale, m_i, l_i, acc, o_d, m_d, o_e, m_e,
               HKV: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BN: tl.constexpr):  # fmt: skip
    """One block of ``BN`` keys from ``start`` into the running (max, sum, acc) of the rows."""
    cols = (start + tl.arange(0, BN)).to(tl.int64)
    m_col = cols < k_hi
    b_kp = tl.load(kpos + cols, mask=m_col, other=0x7FFFFFFFFFFFFFFF)
    b_k = tl.load(k + (cols[:, None] * HKV + i_hk) * D + o_d[None, :], mask=m_col[:, None] & m_d[None, :], other=0.0)
    s = tl.dot(b_q, tl.trans(b_k)) * scale  # [BM, BN] fp32
    vis = (b_kp[None, :] <= b_qp[:, None]) & m_col[None, :]
    s = tl.where(vis, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that have seen nothing yet
    p = tl.exp(s - m_safe[:, None])
    alpha = tl.exp(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    b_v = tl.load(v + (cols[:, None] * HKV + i_hk) * DV + o_e[None, :], mask=m_col[:, None] & m_e[None, :], other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(b_v.dtype), b_v)
    return m_new, l_i, acc


@triton.jit
def _splitk_attn_kernel(
    q, k, v, qpos, kpos, o_part, lse_part, Tq, Tk, keys_per_split, scale,
    HQ: tl.constexpr, HKV: tl.constexpr, G: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BD: tl.constexpr, BDV: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, ASCENDING: tl.constexpr,
    MAXB: tl.constexpr, STAGES: tl.constexpr,
):  # fmt: skip
    i_m = tl.program_id(0)
    i_hk = tl.program_id(1)
    i_s = tl.program_id(2)
    rows = i_m * BM + tl.arange(0, BM)  # row = query * G + head-in-group
    m_row = rows < Tq * G
    qi = (rows // G).to(tl.int64)
    head = i_hk * G + rows % G
    o_d = tl.arange(0, BD)
    m_d = o_d < D
    o_e = tl.arange(0, BDV)
    m_e = o_e < DV
    b_q = tl.load(q + (qi[:, None] * HQ + head[:, None]) * D + o_d[None, :], mask=m_row[:, None] & m_d[None, :],
                  other=0.0)  # fmt: skip
    b_qp = tl.load(qpos + qi, mask=m_row, other=-1)
    qp_max = tl.max(b_qp)
    k_lo = i_s * keys_per_split
    k_hi = tl.minimum(k_lo + keys_per_split, Tk)
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, BDV], tl.float32)
    if ASCENDING:
        # the blocks some row sees are a prefix: count them from their first keys in one load, then
        # run a loop without branches (software-pipelined: the next block's K/V load under this one's dots)
        first = k_lo + tl.arange(0, MAXB).to(tl.int64) * BN
        b_first = tl.load(kpos + first, mask=first < k_hi, other=0x7FFFFFFFFFFFFFFF)
        n_vis = tl.sum((b_first <= qp_max).to(tl.int32))
        for b in tl.range(0, n_vis, num_stages=STAGES):
            m_i, l_i, acc = _key_block(b_q, k, v, kpos, b_qp, k_lo + b * BN, k_hi, i_hk, scale, m_i, l_i, acc,
                                       o_d, m_d, o_e, m_e, HKV, D, DV, BN)  # fmt: skip
    else:
        for start in range(k_lo, k_hi, BN):
            b_kp0 = tl.load(kpos + start + tl.arange(0, BN), mask=start + tl.arange(0, BN) < k_hi,
                            other=0x7FFFFFFFFFFFFFFF)  # fmt: skip
            if tl.min(b_kp0) <= qp_max:
                m_i, l_i, acc = _key_block(b_q, k, v, kpos, b_qp, start, k_hi, i_hk, scale, m_i, l_i, acc,
                                           o_d, m_d, o_e, m_e, HKV, D, DV, BN)  # fmt: skip
    seen = l_i > 0
    lse = tl.where(seen, m_i + tl.log(tl.where(seen, l_i, 1.0)), float("-inf"))
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    row_out = qi * HQ + head  # [Tq, HQ] row-major
    tl.store(lse_part + i_s * Tq * HQ + row_out, lse, mask=m_row)
    tl.store(o_part + (i_s * Tq * HQ + row_out[:, None]) * DV + o_e[None, :], out,
             mask=m_row[:, None] & m_e[None, :])  # fmt: skip


@triton.jit
def _merge_kernel(o_part, lse_part, o, R, NS, DV: tl.constexpr, BS: tl.constexpr, BDV: tl.constexpr):
    """One program per output row (query, head): log-sum-exp weighted mean of the NS partials."""
    r = tl.program_id(0).to(tl.int64)
    o_s = tl.arange(0, BS)
    m_s = o_s < NS
    o_e = tl.arange(0, BDV)
    m_e = o_e < DV
    b_lse = tl.load(lse_part + o_s * R + r, mask=m_s, other=float("-inf"))
    m = tl.max(b_lse)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp(b_lse - m_safe)  # 0 for splits that saw nothing
    b_o = tl.load(o_part + (o_s[:, None] * R + r) * DV + o_e[None, :], mask=m_s[:, None] & m_e[None, :], other=0.0)
    total = tl.sum(w)
    res = tl.sum(b_o * w[:, None], 0) / tl.where(total > 0, total, 1.0)
    tl.store(o + r * DV + o_e, res.to(o.dtype.element_ty), mask=m_e)


_CONFIGS = [
    triton.Config({"BM": bm, "BN": bn, "STAGES": ns}, num_warps=nw, num_stages=ns)
    for bm, bn, nw, ns in (
        (64, 64, 8, 2), (64, 32, 4, 2), (32, 64, 4, 2), (128, 32, 8, 2), (64, 64, 4, 3), (64, 128, 8, 2),
        (128, 64, 8, 2), (64, 64, 8, 3),
    )
]  # fmt: skip
_tuned_kernel = triton.autotune(configs=_CONFIGS, key=["HQ", "HKV", "D", "DV", "ASCENDING"], **autotune_cache())(
    _splitk_attn_kernel
)


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _num_splits(Tq: int, G: int, Hkv: int, Tk: int, device: torch.device) -> int:
    """Key ranges per (row block, kv head) so the grid covers the GPU ~4 times over (64-row
    blocks assumed), each range at least 256 keys."""
    sms = _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    blocks = triton.cdiv(Tq * G, 64) * Hkv
    return max(1, min(triton.cdiv(4 * sms, blocks), triton.cdiv(Tk, 256)))


def splitk_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
    scale: float,
    *,
    num_splits: int | None = None,
    block: tuple[int, int, int] | None = None,
    keys_ascending: bool = False,
) -> torch.Tensor:
    """One sequence: q ``[Tq, Hq, D]`` over k ``[Tk, Hkv, D]``, v ``[Tk, Hkv, Dv]`` (same dtype),
    query i sees key j iff ``k_positions[j] <= q_positions[i]`` (int64 ``[Tq]`` / ``[Tk]``, on the
    device) -> ``[Tq, Hq, Dv]`` in q's dtype.

    ``keys_ascending``: the caller promises ascending key positions (combine's spliced prompt), so
    the key blocks a row block sees are a prefix of its range, counted up front, and the key loop
    has no branch (pipelined). Otherwise every block is checked (skipped when no row sees any of
    its keys). Launch shape autotuned over ``_CONFIGS`` unless ``block = (BM, BN,
    num_warps)`` is given; ``num_splits`` key ranges (default: enough programs for ~4 waves)."""
    Tq, Hq, D = q.shape
    Tk, Hkv, Dv = v.shape
    G = Hq // Hkv
    if Tq == 0 or Tk == 0:
        return q.new_zeros(Tq, Hq, Dv)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    qp = q_positions.to(device=q.device, dtype=torch.int64).contiguous()
    kp = k_positions.to(device=q.device, dtype=torch.int64).contiguous()
    ns = num_splits or _num_splits(Tq, G, Hkv, Tk, q.device)
    per = triton.cdiv(max(Tk, 1), ns)
    o_part = torch.empty(ns, Tq, Hq, Dv, dtype=torch.float32, device=q.device)
    lse_part = torch.empty(ns, Tq, Hq, dtype=torch.float32, device=q.device)
    BD, BDV = max(16, triton.next_power_of_2(D)), max(16, triton.next_power_of_2(Dv))
    args = (q, k, v, qp, kp, o_part, lse_part, Tq, Tk, per, scale)
    # MAXB: blocks per key range at the smallest BN (16), a power of two (the up-front count's width)
    maxb = max(2, triton.next_power_of_2(triton.cdiv(per, 16)))
    consts = dict(HQ=Hq, HKV=Hkv, G=G, D=D, DV=Dv, BD=BD, BDV=BDV, ASCENDING=keys_ascending, MAXB=maxb)
    if block is None:
        _tuned_kernel[lambda meta: (triton.cdiv(Tq * G, meta["BM"]), Hkv, ns)](*args, **consts)
    else:
        bm, bn, nw = block
        _splitk_attn_kernel[(triton.cdiv(Tq * G, bm), Hkv, ns)](*args, **consts, BM=bm, BN=bn, STAGES=2, num_warps=nw)
    o = torch.empty(Tq, Hq, Dv, dtype=q.dtype, device=q.device)
    _merge_kernel[(Tq * Hq,)](o_part, lse_part, o, Tq * Hq, ns, DV=Dv, BS=max(2, triton.next_power_of_2(ns)), BDV=BDV)
    return o
