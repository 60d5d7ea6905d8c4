"""SDPA, the plain-PyTorch twin of ``attention.attention``'s split-K Triton kernel (``attention_triton``)
and its path for everything else (CPU, long query runs). Per sequence, heads first: q ``[Hq, Lq, D]``,
k ``[Hkv, Lk, D]``, v ``[Hkv, Lk, Dv]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_SDPA_GQA = tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 5)  # enable_gqa since torch 2.5


def _native_gqa(q: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """Whether SDPA's ``enable_gqa`` is the faster way: CUDA, and the call can take the flash kernel
    (no mask, fp16/bf16, equal head dims <= 256). The efficient kernel rejects GQA, so a masked or fp32
    call would fall back to the math kernel: those keep repeat_interleave."""
    return (
        _SDPA_GQA
        and q.is_cuda
        and mask is None
        and q.dtype in (torch.float16, torch.bfloat16)
        and q.shape[-1] == v.shape[-1] <= 256
    )


def sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, causal: bool, scale: float
) -> torch.Tensor:
    """q ``[Hq, Lq, D]``, k ``[Hkv, Lk, D]``, v ``[Hkv, Lk, Dv]`` -> ``[Hq, Lq, Dv]``.

    GQA: query head h reads kv head ``h // (Hq // Hkv)``, by SDPA's ``enable_gqa`` where ``_native_gqa``
    says so, else by repeat_interleave (CPU always: its numerics stay as they were).
    """
    # NOTE: 4-D [1, H, L, D] inputs: with 3-D inputs SDPA falls back to the fp32 math kernel on CUDA.
    m = None if mask is None else mask[None, None]
    rep = q.shape[0] // k.shape[0]
    if rep > 1 and _native_gqa(q, v, mask):
        out = F.scaled_dot_product_attention(
            q[None], k[None], v[None], attn_mask=m, is_causal=causal, scale=scale, enable_gqa=True
        )
        return out[0]
    if rep > 1:
        k = k.repeat_interleave(rep, dim=0)
        v = v.repeat_interleave(rep, dim=0)
    out = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=m, is_causal=causal, scale=scale)
    return out[0]


def sdpa_positions(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, scale: float
) -> torch.Tensor:
    """Query i sees key j iff ``k_pos[j] <= q_pos[i]``: q ``[Hq, Lq, D]``, k ``[Hkv, Lk, D]``, v
    ``[Hkv, Lk, Dv]``, positions ``[Lq]`` / ``[Lk]`` -> ``[Hq, Lq, Dv]``; a query that sees no key gets zeros."""
    mask = k_pos[None, :] <= q_pos[:, None]  # [Lq, Lk]
    seen = mask.any(-1)
    mask = mask | ~seen[:, None]  # rows that see nothing would be NaN: unmask them, zeroed below (no host sync)
    o = sdpa(q, k, v, mask, False, scale)
    return o * seen[None, :, None]
