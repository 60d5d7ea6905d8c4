"""How big the state pool is: slots from ``max_running``, KV rows from a setting or free memory."""

from __future__ import annotations

import torch

from hypic_agent.config import Settings
from hypic_agent.runtime.models.config import HybridConfig


def bytes_per_slot(cfg: HybridConfig, dtype: torch.dtype) -> int:
    """Linear-layer state of one request: fp32 recurrent ``[HV, K, V]`` and conv ``[C, W-1]`` per layer."""
    n_lin = sum(1 for k in cfg.layer_types if k == "linear")
    hv, k, v = cfg.linear_state_shape
    rec = hv * k * v * 4
    conv = cfg.linear_conv_dim * max(cfg.linear_conv_kernel_dim - 1, 0) * dtype.itemsize
    return n_lin * (rec + conv)


def bytes_per_token(cfg: HybridConfig, dtype: torch.dtype) -> int:
    """Attention KV of one token over every attention layer (MLA: its latent form)."""
    n_att = sum(1 for k in cfg.layer_types if k != "linear")
    (hk, dk), (hv, dv) = cfg.attention_cache_rows
    return n_att * (hk * dk + hv * dv) * dtype.itemsize


def free_device_memory(device: torch.device) -> int:
    """Free bytes on ``device``, counting the caching allocator's reserved but unused blocks."""
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info(device)
    return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))


def pool_sizes(
    cfg: HybridConfig, settings: Settings, max_context: int, device: torch.device, dtype: torch.dtype
) -> tuple[int, int]:
    """``(slots, kv_tokens)``. KV rows: ``kv_pool_tokens`` if set; else on CUDA ``kv_pool_fraction``
    of the free memory less the slots and the prefix cache's snapshots (``prefix_snapshots``, each
    the size of a slot), at most ``slots * max_context``; on CPU ``2 * max_context``."""
    slots = settings.max_running
    if settings.kv_pool_tokens:
        return slots, settings.kv_pool_tokens
    cap = slots * max_context
    per_token = max(bytes_per_token(cfg, dtype), 1)
    if device.type == "cuda":
        free = free_device_memory(device)
        rows = slots + settings.prefix_snapshots  # linear-state rows: slots and snapshots
        budget = int(free * settings.kv_pool_fraction) - rows * bytes_per_slot(cfg, dtype)
        return slots, max(settings.kv_page_size, min(cap, budget // per_token))
    return slots, min(cap, 2 * max_context)
