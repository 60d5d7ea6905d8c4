"""MoE routing: the router's softmax top-k and the expert-sorted row layout of the routed experts'
Triton kernels (``kernels.moe.moe_triton``). One Triton launch each on CUDA (``moe_route_triton``),
the torch twins elsewhere (``moe_route_torch``); both give the same ids and layout."""

from __future__ import annotations

import torch

from ..backend import resolve_triton
from .moe_route_torch import align_torch, max_blocks, router_topk_torch

__all__ = ["align", "align_torch", "max_blocks", "router_topk", "router_topk_torch"]


def router_topk(
    logits: torch.Tensor, k: int, *, renormalize: bool, backend: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits ``[T, E]`` -> (weights ``[T, k]`` in logits' dtype, expert ids ``[T, k]`` int64):
    fp32 softmax, the k largest in descending order, renormalized over them when ``renormalize``."""
    if logits.dim() != 2 or not 0 < k <= logits.shape[1]:
        raise ValueError(f"need logits [T, E] and 0 < k <= E; got {tuple(logits.shape)} and k={k}")
    if resolve_triton(backend, logits.device):
        from .moe_route_triton import router_topk_triton

        return router_topk_triton(logits, k, renormalize)
    return router_topk_torch(logits, k, renormalize)


def align(
    topk_idx: torch.Tensor, num_experts: int, block: int, *, backend: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """topk_idx ``[T, k]`` -> (``ids [max_blocks * block]`` int64, ``block_expert [max_blocks]`` int32):
    the layout of ``align_torch``."""
    if resolve_triton(backend, topk_idx.device):
        from .moe_route_triton import align_triton

        return align_triton(topk_idx, num_experts, block)
    return align_torch(topk_idx, num_experts, block)
