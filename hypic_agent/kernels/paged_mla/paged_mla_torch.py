"""Paged MLA decode in plain PyTorch (the absorbed form): the twin of ``paged_mla_triton``.

An MLA layer's pages hold, per token, the normed latent ``[R]`` and the shared rope key ``[E]``
(``HybridConfig.attention_cache_rows``). With ``kv_b_proj``'s key half absorbed into the query
(``q_lat = q_nope W_uk``, done by the model), a head's score against token ``j`` is
``q_lat . latent_j + q_rope . rope_j`` and its output, before ``W_uv``, is the softmax-weighted sum of
the latents: attention with one kv head whose key is ``[latent | rope]`` and whose value is the latent.

Every sequence is gathered over the whole block-table width, the keys past ``context_lens`` masked
(and their rows zeroed, so stale or NaN slots cannot leak): fixed shapes and no host sync, so a
decode graph can capture it. It gathers ``[N, width * page, R]`` fp32: transient memory grows with
batch x block-table width, where the Triton kernel reads pages in place. A row with no context gets
zeros.
"""

from __future__ import annotations

import torch


def paged_mla_decode_torch(
    q_lat: torch.Tensor,
    q_rope: torch.Tensor,
    lat_cache: torch.Tensor,
    rope_cache: torch.Tensor,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """q_lat ``[N, H, R]``, q_rope ``[N, H, E]``, lat_cache ``[P, page, 1, R]``, rope_cache
    ``[P, page, 1, E]``, block_table ``[N, max_blocks]``, context_lens ``[N]`` -> the latent-space
    output ``[N, H, R]`` in fp32."""
    n = block_table.shape[0]
    idx = block_table.long().clamp(0, lat_cache.shape[0] - 1)  # entries past a sequence's pages are masked below
    lat = lat_cache[idx].reshape(n, -1, lat_cache.shape[-1]).float()  # [N, S, R]
    kr = rope_cache[idx].reshape(n, -1, rope_cache.shape[-1]).float()  # [N, S, E]
    valid = torch.arange(lat.shape[1], device=lat.device)[None, :] < context_lens.to(lat.device)[:, None]  # [N, S]
    lat = lat.masked_fill(~valid[..., None], 0.0)
    kr = kr.masked_fill(~valid[..., None], 0.0)
    scores = torch.einsum("nhr,nsr->nhs", q_lat.float(), lat) + torch.einsum("nhe,nse->nhs", q_rope.float(), kr)
    scores = (scores * scale).masked_fill(~valid[:, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row with no key: all -inf -> NaN -> 0
    return torch.einsum("nhs,nsr->nhr", probs, lat)
