"""Torch twins of the MoE routing kernels (``moe_route_triton``): the router's softmax top-k and the
expert-sorted row layout of the routed experts' Triton kernels."""

from __future__ import annotations

import torch


def router_topk_torch(logits: torch.Tensor, k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """logits ``[T, E]`` -> (weights ``[T, k]`` in logits' dtype, expert ids ``[T, k]`` int64): softmax
    in fp32, the k largest in descending order, renormalized over the chosen k when ``renormalize``."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float)
    top_w, top_i = torch.topk(probs, k, dim=-1)
    if renormalize:
        top_w = top_w / top_w.sum(dim=-1, keepdim=True)
    return top_w.to(logits.dtype), top_i


def max_blocks(m: int, num_experts: int, block: int) -> int:
    """Upper bound on the padded blocks of ``m`` (token, slot) pairs over ``num_experts`` experts:
    every expert that has rows wastes less than one block."""
    return -(-m // block) + min(num_experts, m)


def align_torch(topk_idx: torch.Tensor, num_experts: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(token, slot) pairs grouped by expert in slot order, each expert's padded to whole ``block``-row
    blocks, with no host sync: ``ids [max_blocks * block]`` the flat slot index ``t * k + j`` of each
    row (``T * k`` for padding) and ``block_expert [max_blocks]`` int32 (-1 past the last used block).

    One stable sort of the slots by expert and a few ``[E]``-sized ops (a row's place is its expert's
    first padded row plus its rank among the expert's slots)."""
    flat = topk_idx.reshape(-1).long()
    m = flat.numel()
    dev = flat.device
    expert, order = torch.sort(flat, stable=True)
    counts = torch.zeros(num_experts, dtype=torch.long, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    nblk = (counts + block - 1) // block
    blk_end = nblk.cumsum(0)
    first_row = (blk_end - nblk) * block  # [E] first padded row of each expert
    first_slot = counts.cumsum(0) - counts  # [E] first sorted position of each expert
    pos = first_row[expert] + torch.arange(m, device=dev) - first_slot[expert]
    nb = max_blocks(m, num_experts, block)
    ids = torch.full((nb * block,), m, dtype=torch.long, device=dev)
    ids[pos] = order
    be = torch.searchsorted(blk_end, torch.arange(nb, device=dev), right=True)
    return ids, torch.where(be < num_experts, be, -1).to(torch.int32)
