"""Paged decode attention in Triton (CUDA; imported lazily). Twin: ``paged_attention_torch``.

Flash-decoding over a page pool, one query token per sequence:

* grid ``(N, Hkv, NS)``: a program owns one sequence, one kv head and one of ``NS`` key ranges
  (splits). Its rows are the ``G = Hq // Hkv`` query heads of that kv head, padded to ``BM``
  (>= 16, a power of two), so each K/V tile is read once per GQA group;
* a sequence of ``L`` keys is cut into ``NS`` ranges of ``cdiv(cdiv(L, NS), BN) * BN`` keys, in
  the kernel, from ``context_lens``: a batch-1 long context spreads over all ``NS`` programs, a
  short one leaves the last splits empty (they run no iteration and read no page);
* a ``BN``-key tile looks each key's page up in the block table (``key // PAGE``) and reads its
  slot (``key % PAGE``), so the tile size is independent of the page size;
* each program keeps the running (max, sum, acc) in fp32, in base 2 (``exp2`` with the scale
  folded into ``log2(e) * scale``), and writes its partial output and log-sum-exp; a second
  kernel merges the ``NS`` partials per (sequence, head). With ``NS == 1`` the first kernel
  writes the output itself.

CUDA-graph capturable: no host sync, no autotuning, grid and buffers sized from shapes only;
context lengths and page ids are read on the device, so a captured launch serves any lengths
up to ``max_blocks * page_size`` and any page assignment. A sequence of length 0 gets zeros.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

MIN_KEYS_PER_SPLIT = 512  # splits are capped so a full block-table row gives each at least this many keys
MAX_SPLITS = 256


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    """``a @ b`` in fp32; ``IEEE``: fp32 inputs, exact fp32 products (no tf32)."""
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _key_range(context_lens, i_n, i_s, NS, BN: tl.constexpr):
    """Keys ``[lo, hi)`` of split ``i_s`` of sequence ``i_n``: ``NS`` ranges of whole ``BN``-key tiles."""
    L = tl.load(context_lens + i_n).to(tl.int32)
    per = tl.cdiv(tl.cdiv(L, NS), BN) * BN
    lo = i_s * per
    return lo, tl.minimum(lo + per, L)


@triton.jit
def _softmax_step(s, m_i, l_i):
    """One tile of online softmax in base 2: scores ``s [BM, BN]`` (-inf where masked) against the
    running max ``m_i`` and sum ``l_i`` -> (p, alpha (the rescale of what came before), m, l)."""
    m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: the tile has at least one key
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    return p, alpha, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _write_out(
    o, o_part, lse_part, acc, m_i, l_i, row_out, i_s, m_row, o_e, m_e, DV: tl.constexpr, NS, ONE: tl.constexpr
):  # fmt: skip
    """A program's result for its rows ``row_out`` (= sequence * heads + head): the output itself with
    one split, else its partial output and log-sum-exp for the merge kernel; zeros for no keys."""
    seen = l_i > 0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    if ONE:
        tl.store(o + row_out[:, None] * DV + o_e[None, :], out.to(o.dtype.element_ty),
                 mask=m_row[:, None] & m_e[None, :])  # fmt: skip
    else:
        lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
        tl.store(lse_part + row_out * NS + i_s, lse, mask=m_row)
        tl.store(o_part + (row_out[:, None] * NS + i_s) * DV + o_e[None, :], out,
                 mask=m_row[:, None] & m_e[None, :])  # fmt: skip


@triton.jit(do_not_specialize=["sbt_n", "NS"])  # a new split count or table width: no recompile
def _paged_decode_kernel(
    q, k, v, block_table, context_lens, o, o_part, lse_part, qk_scale,
    sq_n, sq_h, sk_p, sk_s, sk_h, sv_p, sv_s, sv_h, sbt_n,
    HQ: tl.constexpr, G: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, PAGE: tl.constexpr,
    NS, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
    IEEE: tl.constexpr, ONE: tl.constexpr,
):  # fmt: skip
    i_n = tl.program_id(0).to(tl.int64)
    i_hk = tl.program_id(1)
    i_s = tl.program_id(2)
    rows = tl.arange(0, BM)  # head in group
    m_row = rows < G
    head = i_hk * G + rows
    o_d = tl.arange(0, BD)
    m_d = o_d < D
    o_e = tl.arange(0, BDV)
    m_e = o_e < DV
    b_q = tl.load(q + i_n * sq_n + head[:, None] * sq_h + o_d[None, :], mask=m_row[:, None] & m_d[None, :],
                  other=0.0)  # fmt: skip  # [BM, BD]
    lo, hi = _key_range(context_lens, i_n, i_s, NS, BN)
    bt_row = block_table + i_n * sbt_n
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, BDV], tl.float32)
    for start in range(lo, hi, BN):  # no iteration past the context (L == 0: none at all)
        cols = start + tl.arange(0, BN)
        m_col = cols < hi
        page = tl.load(bt_row + cols // PAGE, mask=m_col, other=0).to(tl.int64)
        slot = (cols % PAGE).to(tl.int64)
        b_k = tl.load(k + (page * sk_p + slot * sk_s + i_hk * sk_h)[:, None] + o_d[None, :],
                      mask=m_col[:, None] & m_d[None, :], other=0.0)  # fmt: skip  # [BN, BD]
        s = _dot(b_q, tl.trans(b_k), IEEE) * qk_scale  # [BM, BN], log2 units
        s = tl.where(m_col[None, :], s, float("-inf"))
        p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i)
        b_v = tl.load(v + (page * sv_p + slot * sv_s + i_hk * sv_h)[:, None] + o_e[None, :],
                      mask=m_col[:, None] & m_e[None, :], other=0.0)  # fmt: skip  # [BN, BDV]
        acc = acc * alpha[:, None] + _dot(p.to(b_v.dtype), b_v, IEEE)
    _write_out(o, o_part, lse_part, acc, m_i, l_i, i_n * HQ + head, i_s, m_row, o_e, m_e, DV, NS, ONE)


@triton.jit(do_not_specialize=["NS"])
def _merge_kernel(o_part, lse_part, o, NS, DV: tl.constexpr, BS: tl.constexpr, SB: tl.constexpr,
                  BE: tl.constexpr):  # fmt: skip
    """Program ``(r, e)``: columns ``e*BE ..`` of row ``r`` = (sequence, head), the ``NS`` partials
    weighted by ``2^(lse - max lse)``, read ``SB`` splits at a time."""
    r = tl.program_id(0).to(tl.int64)
    o_e = tl.program_id(1) * BE + tl.arange(0, BE)
    m_e = o_e < DV
    o_s = tl.arange(0, BS)
    b_lse = tl.load(lse_part + r * NS + o_s, mask=o_s < NS, other=float("-inf"))  # [BS]
    m = tl.max(b_lse)
    m_safe = tl.where(m == float("-inf"), 0.0, m)  # every split empty (length 0): all weights 0
    total = tl.sum(tl.exp2(b_lse - m_safe))
    acc = tl.zeros([BE], tl.float32)
    for c in range(0, NS, SB):
        o_c = c + tl.arange(0, SB)
        m_c = o_c < NS
        w = tl.exp2(tl.load(lse_part + r * NS + o_c, mask=m_c, other=float("-inf")) - m_safe)  # [SB]
        b_o = tl.load(o_part + (r * NS + o_c[:, None]) * DV + o_e[None, :], mask=m_c[:, None] & m_e[None, :],
                      other=0.0)  # fmt: skip  # [SB, BE]
        acc += tl.sum(b_o * w[:, None], 0)
    tl.store(o + r * DV + o_e, (acc / tl.where(total > 0, total, 1.0)).to(o.dtype.element_ty), mask=m_e)


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def default_num_splits(n_seqs: int, hkv: int, max_blocks: int, page_size: int, device: torch.device) -> int:
    """Key ranges per (sequence, kv head), from shapes only: enough programs for ~4 per SM, at
    most one per ``MIN_KEYS_PER_SPLIT`` keys of a full block-table row, at most ``MAX_SPLITS``.
    (Batch 1, Hkv 2, a 20k-key table on an H200's 132 SMs: 157 splits of ~128 keys.)"""
    if device.type == "cuda":
        sms = _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    else:
        sms = 8  # the CPU interpreter: a nominal count
    want = triton.cdiv(4 * sms, max(1, n_seqs * hkv))
    cap = triton.cdiv(max(1, max_blocks * page_size), MIN_KEYS_PER_SPLIT)
    return max(1, min(want, cap, MAX_SPLITS))


def default_block(D: int, Dv: int, n_seqs: int = 1) -> tuple[int, int]:
    """``(BN, num_warps)``: 64-key tiles up to 128-wide heads; above, 128-key tiles with 8 warps for
    small batches and 64 with 4 from batch 32 (measured on the H200 at D = 256, Hkv = 2,
    ``benchmarks/decode_kernels.py``: batch 1 at 20k keys 34 us, batch 64 at 2k 85 us)."""
    if max(D, Dv) <= 128:
        return (64, 4)
    return (128, 8) if n_seqs < 32 else (64, 4)


def paged_decode_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    *,
    num_splits: int | None = None,
    block: tuple[int, int] | None = None,
) -> torch.Tensor:
    """q ``[N, Hq, D]``, k_cache ``[P, page_size, Hkv, D]``, v_cache ``[P, page_size, Hkv, Dv]``
    (q's dtype; unit stride on the last dim), block_table ``[N, max_blocks]`` and context_lens
    ``[N]`` (integer, on q's device) -> ``[N, Hq, Dv]`` in q's dtype. Arguments are checked by the
    dispatcher (``paged_decode_attention``); ``block = (BN, num_warps)`` overrides
    ``default_block``, ``num_splits`` overrides ``default_num_splits``."""
    N, Hq, D = q.shape
    _, page_size, Hkv, _ = k_cache.shape
    Dv = v_cache.shape[-1]
    G = Hq // Hkv
    ns = num_splits or default_num_splits(N, Hkv, block_table.shape[1], page_size, q.device)
    bn, nw = block or default_block(D, Dv, N)
    o = torch.empty(N, Hq, Dv, dtype=q.dtype, device=q.device)
    if N == 0:
        return o
    if q.stride(-1) != 1:
        q = q.contiguous()
    if block_table.stride(-1) != 1:
        block_table = block_table.contiguous()
    context_lens = context_lens.contiguous()
    if ns > 1:
        o_part = torch.empty(N, Hq, ns, Dv, dtype=torch.float32, device=q.device)
        lse_part = torch.empty(N, Hq, ns, dtype=torch.float32, device=q.device)
    else:
        o_part = lse_part = o  # not read: the kernel writes o directly
    BD, BDV = max(16, triton.next_power_of_2(D)), max(16, triton.next_power_of_2(Dv))
    _paged_decode_kernel[(N, Hkv, ns)](
        q, k_cache, v_cache, block_table, context_lens, o, o_part, lse_part, scale * math.log2(math.e),
        q.stride(0), q.stride(1), *k_cache.stride()[:3], *v_cache.stride()[:3], block_table.stride(0),
        HQ=Hq, G=G, D=D, DV=Dv, PAGE=page_size, NS=ns, BM=max(16, triton.next_power_of_2(G)), BN=bn, BD=BD,
        BDV=BDV, IEEE=q.dtype == torch.float32, ONE=ns == 1, num_warps=nw,
    )  # fmt: skip
    if ns > 1:
        be = min(BDV, 64)
        _merge_kernel[(N * Hq, triton.cdiv(Dv, be))](
            o_part, lse_part, o, NS=ns, DV=Dv, BS=max(2, triton.next_power_of_2(ns)), SB=16, BE=be
        )
    return o
