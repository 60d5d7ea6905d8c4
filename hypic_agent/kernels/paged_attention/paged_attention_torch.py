"""Paged decode attention in plain PyTorch: the twin of ``paged_attention_triton``.

Each sequence's keys and values live in pages of a preallocated pool; its block-table row lists
the page ids in order, so key ``j`` of sequence ``i`` is slot ``j % page_size`` of page
``block_table[i, j // page_size]``. Here every sequence's pages are gathered into a dense
``[L, Hkv, D]`` key tensor (its first ``L = context_lens[i]`` keys) and one query token per
sequence attends to all of them in fp32. A sequence with ``L == 0`` reads no page and gets zeros.

Host syncs (``.tolist()``) and a Python loop over sequences: this is the readable reference, not
the serving path.
"""

from __future__ import annotations

import torch


def paged_decode_attention_torch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """q ``[N, Hq, D]``, k_cache ``[P, page_size, Hkv, D]``, v_cache ``[P, page_size, Hkv, Dv]``,
    block_table ``[N, max_blocks]`` (page ids), context_lens ``[N]`` -> ``[N, Hq, Dv]`` in q's dtype.

    Query head ``h`` reads kv head ``h // (Hq // Hkv)``. Raises ``ValueError`` when a context
    length is negative or needs more pages than the block-table row holds.
    """
    N, Hq, _ = q.shape
    _, page_size, Hkv, _ = k_cache.shape
    Dv = v_cache.shape[-1]
    max_blocks = block_table.shape[1]
    out = torch.zeros(N, Hq, Dv, dtype=torch.float32, device=q.device)
    cap = max_blocks * page_size
    for i, L in enumerate(context_lens.tolist()):
        if not 0 <= L <= cap:
            raise ValueError(f"context_lens[{i}] = {L} is outside 0..{cap} (max_blocks * page_size)")
        if L == 0:
            continue
        n_pages = -(-L // page_size)
        pages = block_table[i, :n_pages].to(device=k_cache.device, dtype=torch.long)
        k = k_cache[pages].reshape(n_pages * page_size, Hkv, -1)[:L].float()  # [L, Hkv, D]
        v = v_cache[pages].reshape(n_pages * page_size, Hkv, -1)[:L].float()  # [L, Hkv, Dv]
        k = k.repeat_interleave(Hq // Hkv, dim=1).to(q.device)  # [L, Hq, D]
        v = v.repeat_interleave(Hq // Hkv, dim=1).to(q.device)  # [L, Hq, Dv]
        scores = torch.einsum("hd,lhd->hl", q[i].float(), k) * scale  # [Hq, L]
        probs = torch.softmax(scores, dim=-1)
        out[i] = torch.einsum("hl,lhv->hv", probs, v)
    return out.to(q.dtype)
