"""MoE routing in Triton (CUDA; imported lazily). Twins: ``moe_route_torch``.

At decode sizes the routing is bookkeeping, not arithmetic: torch spends ~6 launches on the
router's softmax / top-k / renormalization and ~17 on the expert-sorted layout (sort, scatter,
cumsums, searchsorted, fills) per MoE layer, which in a 40-layer decode step is ~900 of its ~3,100
kernels. Here each is one launch:

* ``_router_topk_kernel``, grid ``(T,)``: one row's softmax over E experts (fp32), then k rounds of
  arg-max (ties to the lower expert id) and optional renormalization;
* ``_align_kernel``, grid ``(1,)``: one program walks the ``m = T * k`` slots in chunks twice:
  expert counts -> padded block ends (a cumsum over E) -> each block's expert and the padding fill;
  then each slot's row is its expert's running cursor plus its rank among the chunk's slots of the
  same expert (slot order kept: the same layout as ``align_torch``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .moe_route_torch import max_blocks


@triton.jit
def _router_topk_kernel(logits, top_w, top_i, E, stride, K: tl.constexpr, KP: tl.constexpr, BE: tl.constexpr,
                        RENORM: tl.constexpr):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BE)
    x = tl.load(logits + row * stride + offs, mask=offs < E, other=float("-inf")).to(tl.float32)
    p = tl.exp(x - tl.max(x, axis=0))
    p = p / tl.sum(p, axis=0)
    p = tl.where(offs < E, p, -1.0)
    kk = tl.arange(0, KP)
    ws = tl.zeros([KP], dtype=tl.float32)
    ids = tl.zeros([KP], dtype=tl.int64)
    for j in tl.static_range(K):
        best = tl.max(p, axis=0)
        idx = tl.min(tl.where(p == best, offs, BE), axis=0)  # the lowest expert id among equal maxima
        ws = tl.where(kk == j, best, ws)
        ids = tl.where(kk == j, idx.to(tl.int64), ids)
        p = tl.where(offs == idx, -1.0, p)
    if RENORM:
        ws = ws / tl.sum(ws, axis=0)
    tl.store(top_w + row * K + kk, ws.to(top_w.dtype.element_ty), mask=kk < K)
    tl.store(top_i + row * K + kk, ids, mask=kk < K)


@triton.jit
def _align_kernel(flat, ids, block_expert, m, E, NB, BLOCK: tl.constexpr, BE: tl.constexpr, CH: tl.constexpr,
                  CB: tl.constexpr):  # fmt: skip
    ex = tl.arange(0, BE)
    ch = tl.arange(0, CH)
    counts = tl.zeros([BE], dtype=tl.int32)
    for c in range(0, m, CH):  # pass 1: rows per expert
        e = tl.load(flat + c + ch, mask=c + ch < m, other=-1)
        counts += tl.sum((e[:, None] == ex[None, :]).to(tl.int32), axis=0)
    nblk = (counts + BLOCK - 1) // BLOCK
    blk_end = tl.cumsum(nblk, axis=0)  # [BE]; experts >= E have no blocks
    cursor = (blk_end - nblk) * BLOCK  # [BE] first padded row of each expert
    cb = tl.arange(0, CB)
    for b0 in range(0, NB, CB):  # each block's expert: how many experts' blocks end at or before it
        b = b0 + cb
        owner = tl.sum(((blk_end[None, :] <= b[:, None]) & (ex[None, :] < E)).to(tl.int32), axis=1)
        tl.store(block_expert + b, tl.where(owner < E, owner, -1), mask=b < NB)
        pad = tl.zeros([CB], dtype=tl.int64) + m  # padding rows point past the last slot
        for r in tl.static_range(BLOCK):
            tl.store(ids + b * BLOCK + r, pad, mask=b < NB)
    tl.debug_barrier()  # the fill lands before the rows overwrite it
    earlier = ch[None, :] < ch[:, None]  # [CH, CH]: slot j comes before slot i within a chunk
    for c in range(0, m, CH):  # pass 2: each slot's row
        i = c + ch
        live = i < m
        e = tl.load(flat + i, mask=live, other=-1)
        hit = (e[:, None] == ex[None, :]) & live[:, None]  # [CH, BE]
        base = tl.sum(tl.where(hit, cursor[None, :], 0), axis=1)
        rank = tl.sum(((e[:, None] == e[None, :]) & earlier & live[None, :]).to(tl.int32), axis=1)
        tl.store(ids + base + rank, i.to(tl.int64), mask=live)
        cursor += tl.sum(hit.to(tl.int32), axis=0)


def router_topk_triton(logits: torch.Tensor, k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as ``router_topk_torch``: logits ``[T, E]`` -> (``[T, k]`` weights, ``[T, k]`` ids)."""
    T, E = logits.shape
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()  # rows may be strided (a fused GEMM's slice)
    top_w = torch.empty(T, k, dtype=logits.dtype, device=logits.device)
    top_i = torch.empty(T, k, dtype=torch.int64, device=logits.device)
    if T:
        be = triton.next_power_of_2(E)
        _router_topk_kernel[(T,)](
            logits, top_w, top_i, E, logits.stride(0), K=k, KP=triton.next_power_of_2(k), BE=be, RENORM=renormalize,
            num_warps=4 if be >= 512 else 2,
        )  # fmt: skip
    return top_w, top_i


def align_triton(
    topk_idx: torch.Tensor, num_experts: int, block: int, *, chunk: int = 32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract and layout as ``align_torch`` (one launch, no host reads)."""
    flat = topk_idx.reshape(-1).contiguous()
    m = flat.numel()
    nb = max_blocks(m, num_experts, block)
    ids = torch.empty(nb * block, dtype=torch.int64, device=flat.device)
    block_expert = torch.empty(nb, dtype=torch.int32, device=flat.device)
    _align_kernel[(1,)](
        flat, ids, block_expert, m, num_experts, nb, BLOCK=block, BE=triton.next_power_of_2(num_experts),
        CH=chunk, CB=32, num_warps=4,
    )  # fmt: skip
    return ids, block_expert
