"""Paged MLA decode in Triton (CUDA; imported lazily). Twin: ``paged_mla_torch``.

The absorbed form of ``paged_mla_torch`` as flash-decoding over the page pool, one query token per
sequence: attention with one kv head whose key is ``[latent R | rope E]`` and whose value is the
latent, read in place from the two page tensors an MLA layer keeps.

* grid ``(N, cdiv(H, BM), NS)``: a program owns one sequence, ``BM`` heads (all heads share the one
  kv head, so a latent tile is read once per ``BM`` heads) and one of ``NS`` key ranges, cut as in
  ``paged_attention_triton`` (whole ``BN``-key tiles from ``context_lens``, on the device);
* per tile: scores ``q_lat @ latent^T + q_rope @ rope^T`` ``[BM, BN]``, the running (max, sum, acc)
  in fp32 base 2, ``acc [BM, R] += p @ latent``;
* with ``NS > 1`` the partials and their log-sum-exp are merged by ``paged_attention_triton``'s
  merge kernel (value width ``R``).

CUDA-graph capturable: no host sync, no autotuning, grid and buffers from shapes only. A sequence of
length 0 gets zeros.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..paged_attention.paged_attention_triton import (
    _dot,
    _key_range,
    _merge_kernel,
    _softmax_step,
    _write_out,
    default_num_splits,
)


@triton.jit(do_not_specialize=["sbt_n", "NS"])  # a new split count or table width: no recompile
def _paged_mla_kernel(
    q_lat, q_rope, lat, rope, block_table, context_lens, o, o_part, lse_part, qk_scale,
    sql_n, sql_h, sqr_n, sqr_h, sl_p, sl_s, sr_p, sr_s, sbt_n,
    H: tl.constexpr, R: tl.constexpr, E: tl.constexpr, PAGE: tl.constexpr, NS,
    BM: tl.constexpr, BN: tl.constexpr, BR: tl.constexpr, BE: tl.constexpr, IEEE: tl.constexpr,
    ONE: tl.constexpr,
):  # fmt: skip
    i_n = tl.program_id(0).to(tl.int64)
    i_hb = tl.program_id(1)
    i_s = tl.program_id(2)
    head = i_hb * BM + tl.arange(0, BM)
    m_row = head < H
    o_r = tl.arange(0, BR)
    m_r = o_r < R
    o_e = tl.arange(0, BE)
    m_e = o_e < E
    b_ql = tl.load(q_lat + i_n * sql_n + head[:, None] * sql_h + o_r[None, :], mask=m_row[:, None] & m_r[None, :],
                   other=0.0)  # fmt: skip  # [BM, BR]
    b_qr = tl.load(q_rope + i_n * sqr_n + head[:, None] * sqr_h + o_e[None, :], mask=m_row[:, None] & m_e[None, :],
                   other=0.0)  # fmt: skip  # [BM, BE]
    lo, hi = _key_range(context_lens, i_n, i_s, NS, BN)
    bt_row = block_table + i_n * sbt_n
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, BR], tl.float32)
    for start in range(lo, hi, BN):  # no iteration past the context (L == 0: none at all)
        cols = start + tl.arange(0, BN)
        m_col = cols < hi
        page = tl.load(bt_row + cols // PAGE, mask=m_col, other=0).to(tl.int64)
        slot = (cols % PAGE).to(tl.int64)
        b_l = tl.load(lat + (page * sl_p + slot * sl_s)[:, None] + o_r[None, :], mask=m_col[:, None] & m_r[None, :],
                      other=0.0)  # fmt: skip  # [BN, BR]
        b_k = tl.load(rope + (page * sr_p + slot * sr_s)[:, None] + o_e[None, :], mask=m_col[:, None] & m_e[None, :],
                      other=0.0)  # fmt: skip  # [BN, BE]
        s = (_dot(b_ql, tl.trans(b_l), IEEE) + _dot(b_qr, tl.trans(b_k), IEEE)) * qk_scale  # [BM, BN], log2 units
        s = tl.where(m_col[None, :], s, float("-inf"))
        p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i)
        acc = acc * alpha[:, None] + _dot(p.to(b_l.dtype), b_l, IEEE)
    _write_out(o, o_part, lse_part, acc, m_i, l_i, i_n * H + head, i_s, m_row, o_r, m_r, R, NS, ONE)


def default_block(n_seqs: int) -> tuple[int, int, int]:
    """``(BM, BN, num_warps)``: 16 heads and 32 keys per tile (a ``[16, 512]`` fp32 accumulator and a
    ``[32, 512]`` latent tile at Kimi Linear's rank); not yet tuned on a GPU."""
    return (16, 32, 8) if n_seqs < 32 else (16, 32, 4)


def paged_mla_decode_triton(
    q_lat: torch.Tensor,
    q_rope: torch.Tensor,
    lat_cache: torch.Tensor,
    rope_cache: torch.Tensor,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    *,
    num_splits: int | None = None,
    block: tuple[int, int, int] | None = None,
) -> torch.Tensor:
    """q_lat ``[N, H, R]``, q_rope ``[N, H, E]`` (the caches' dtype), lat_cache ``[P, page, 1, R]``,
    rope_cache ``[P, page, 1, E]`` (unit stride on the last dim), block_table ``[N, max_blocks]``,
    context_lens ``[N]`` (integer, on the same device) -> ``[N, H, R]`` in q_lat's dtype. Checked by
    the dispatcher (``paged_mla_decode``); ``block = (BM, BN, num_warps)``."""
    N, H, R = q_lat.shape
    E = q_rope.shape[-1]
    page_size = lat_cache.shape[1]
    bm, bn, nw = block or default_block(N)
    bm = min(bm, max(16, triton.next_power_of_2(H)))
    head_blocks = triton.cdiv(H, bm)
    ns = num_splits or default_num_splits(N, head_blocks, block_table.shape[1], page_size, q_lat.device)
    o = torch.empty(N, H, R, dtype=q_lat.dtype, device=q_lat.device)
    if N == 0:
        return o
    q_lat, q_rope = q_lat.contiguous(), q_rope.contiguous()
    block_table, context_lens = block_table.contiguous(), context_lens.contiguous()
    if ns > 1:
        o_part = torch.empty(N, H, ns, R, dtype=torch.float32, device=q_lat.device)
        lse_part = torch.empty(N, H, ns, dtype=torch.float32, device=q_lat.device)
    else:
        o_part = lse_part = o  # not read: the kernel writes o directly
    _paged_mla_kernel[(N, head_blocks, ns)](
        q_lat, q_rope, lat_cache, rope_cache, block_table, context_lens, o, o_part, lse_part,
        scale * math.log2(math.e), q_lat.stride(0), q_lat.stride(1), q_rope.stride(0), q_rope.stride(1),
        lat_cache.stride(0), lat_cache.stride(1), rope_cache.stride(0), rope_cache.stride(1), block_table.stride(0),
        H=H, R=R, E=E, PAGE=page_size, NS=ns, BM=bm, BN=bn, BR=max(16, triton.next_power_of_2(R)),
        BE=max(16, triton.next_power_of_2(E)), IEEE=q_lat.dtype == torch.float32, ONE=ns == 1, num_warps=nw,
    )  # fmt: skip
    if ns > 1:
        be = min(triton.next_power_of_2(R), 64)
        _merge_kernel[(N * H, triton.cdiv(R, be))](
            o_part, lse_part, o, NS=ns, DV=R, BS=max(2, triton.next_power_of_2(ns)), SB=16, BE=be
        )
    return o
