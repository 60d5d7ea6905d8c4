"""Multi-head latent attention as Kimi Linear (NoPE) and Ling 3 (RoPE, a head gate) run it.

q ``[H, nope + rope]`` from ``q_proj`` (or the low-rank ``q_a`` / ``q_b`` pair); the compressed KV
``kv_a_proj_with_mqa(x)`` = latent ``[r]`` (RMSNorm'd) + a shared key part ``[rope]``; ``kv_b_proj``
expands the latent to per-head ``k_nope`` and ``v``; a head's key is ``[k_nope | k_shared]``. No
position encoding in Kimi Linear ("NoPE"); Ling 3 (``bailing_hybrid``) rotates the rope part of q and
the shared key (DeepSeek's interleaved pairs) and gates each head's output by ``sigmoid(g_proj(x))``.

What is cached (entries, request states, the pool's pages) is the latent form: ``qkv`` returns as
its "k" the shared rope key ``[T, 1, rope]`` and as its "v" the normed latent ``[T, 1, r]``
(``HybridConfig.attention_cache_rows``), so the RoPE part is all that rotation touches: an entry's
keys are re-rotated to their segment's offset like any attention key, on the rope dims only.
``attend`` expands the latent through ``kv_b_proj`` into per-head keys and values of one width
(``head_dim = nope + rope``: values zero-padded from ``v_head_dim``, the output sliced back) and runs
the common attention; ``paged_decode`` runs decode in the absorbed form (``q_nope W_uk`` against the
latent, ``W_uv`` after) through ``kernels.paged_mla`` (a Triton kernel on CUDA, its torch twin on CPU).
Kimi-Linear-48B: 576 cached values per token and layer instead of 2 x 32 heads x 192.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hypic_agent.kernels.paged_mla import paged_mla_decode
from hypic_agent.runtime.models.config import HybridConfig
from hypic_agent.runtime.models.layers.attention import FullAttention
from hypic_agent.runtime.models.layers.norms import RMSNorm


class MLAttention(FullAttention):
    def __init__(self, cfg: HybridConfig) -> None:
        nn.Module.__init__(self)  # FullAttention's projections do not apply
        mla = cfg.mla
        assert mla is not None
        self.hq = self.hkv = cfg.num_attention_heads
        self.nope, self.rope, self.v_dim, self.rank = (
            mla.qk_nope_head_dim,
            mla.qk_rope_head_dim,
            mla.v_head_dim,
            mla.kv_lora_rank,
        )
        self.d = self.nope + self.rope
        self.gated, self.theta = False, cfg.rope_theta
        self.rotary_dim = self.rope if cfg.rotary_dim else 0  # Ling 3: RoPE on the rope part (Kimi: NoPE)
        self.scale = self.d**-0.5
        self.backend = "auto"
        self.k_row, self.v_row = cfg.attention_cache_rows  # (1, rope) and (1, r): the latent form
        self.q_norm = self.k_norm = None
        d = cfg.hidden_size
        if mla.q_lora_rank:
            self.q_a_proj = nn.Linear(d, mla.q_lora_rank, bias=cfg.attention_bias)
            self.q_a_layernorm = RMSNorm(mla.q_lora_rank, 1e-6, zero_centered=False)
            self.q_b_proj = nn.Linear(mla.q_lora_rank, self.hq * self.d, bias=False)
        else:
            self.q_proj = nn.Linear(d, self.hq * self.d, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(d, self.rank + self.rope, bias=cfg.attention_bias)
        self.kv_a_layernorm = RMSNorm(self.rank, 1e-6, zero_centered=False)  # transformers' default eps
        self.kv_b_proj = nn.Linear(self.rank, self.hq * (self.nope + self.v_dim), bias=False)
        self.o_proj = nn.Linear(self.hq * self.v_dim, d, bias=cfg.attention_bias)
        self.q_lora = bool(mla.q_lora_rank)
        self.g_proj = nn.Linear(d, self.hq, bias=False) if mla.head_gate else None

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """x ``[T, D]`` -> q ``[T, H, nope + rope]``, the shared rope key ``[T, 1, rope]``, the normed
        latent ``[T, 1, r]`` (what is cached), the head gate ``[T, H]`` or None."""
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))) if self.q_lora else self.q_proj(x)
        latent, k_shared = torch.split(self.kv_a_proj_with_mqa(x), [self.rank, self.rope], dim=-1)
        latent = self.kv_a_layernorm(latent)[:, None, :]
        q = q.view(x.shape[0], self.hq, self.d)
        gate = self.g_proj(x) if self.g_proj is not None else None
        if not self.rotary_dim:
            return q, k_shared[:, None, :].contiguous(), latent, gate
        # RoPE'd: heads laid out [rope | nope] (a permutation of both q and k: same scores) with the rope
        # part de-interleaved, so the rotate-half RoPE on the first rotary dims = DeepSeek's interleaved one
        q_nope, q_rope = torch.split(q, [self.nope, self.rope], dim=-1)
        q = torch.cat([q_rope[..., 0::2], q_rope[..., 1::2], q_nope], dim=-1)
        k = torch.cat([k_shared[:, 0::2], k_shared[:, 1::2]], dim=-1)[:, None, :]
        return q, k, latent, gate

    def expand(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cached rope keys ``[T, 1, rope]`` (rotated where they are) and latents ``[T, 1, r]`` -> per-head
        keys ``[T, H, nope + rope]`` (q's layout) and values ``[T, H, nope + rope]`` (zero-padded)."""
        t = v.shape[0]
        w = self.kv_b_proj.weight
        kv = F.linear(v.reshape(t, self.rank).to(w.dtype), w).view(t, self.hq, self.nope + self.v_dim)
        k_nope, values = torch.split(kv, [self.nope, self.v_dim], dim=-1)
        k_rope = k.reshape(t, 1, self.rope).to(kv.dtype).expand(t, self.hq, self.rope)
        keys = torch.cat([k_rope, k_nope] if self.rotary_dim else [k_nope, k_rope], dim=-1)
        return keys, F.pad(values, (0, self.d - self.v_dim))

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        cu_seqlens_k: torch.Tensor,
        q_positions: torch.Tensor | None = None,
        k_positions: torch.Tensor | None = None,
        keys_ascending: bool = False,
    ) -> torch.Tensor:
        """Rotated q ``[Tq, H, D]`` over cached rope keys ``[Tk, 1, rope]`` and latents ``[Tk, 1, r]``
        (expanded here) -> ``[Tq, H, D]``."""
        keys, values = self.expand(k, v)
        return super().attend(q, keys, values, cu_seqlens_q, cu_seqlens_k, q_positions, k_positions, keys_ascending)

    def paged_decode(
        self,
        q: torch.Tensor,
        k_pages: torch.Tensor,
        v_pages: torch.Tensor,
        block_table: torch.Tensor,
        context_lens: torch.Tensor,
    ) -> torch.Tensor:
        """One rotated query per sequence ``[N, H, D]`` over its pages of rope keys ``[P, page, 1, rope]``
        and latents ``[P, page, 1, r]`` -> ``[N, H, D]``, in the absorbed form: ``q_nope W_uk`` against
        the latents (``kernels.paged_mla``: Triton on CUDA, reading pages in place; the torch twin on
        CPU), ``W_uv`` after. No host sync: a decode graph captures it."""
        w = self.kv_b_proj.weight.float().view(self.hq, self.nope + self.v_dim, self.rank)
        qf = q.float()
        if self.rotary_dim:  # q's layout: [rope | nope] (RoPE'd) or [nope | rope] (NoPE)
            q_rope, q_nope = qf[..., : self.rope], qf[..., self.rope :]
        else:
            q_rope, q_nope = qf[..., self.nope :], qf[..., : self.nope]
        q_lat = torch.einsum("nhd,hdr->nhr", q_nope, w[:, : self.nope])
        o_lat = paged_mla_decode(
            q_lat, q_rope, v_pages, k_pages, block_table, context_lens, scale=self.scale, backend=self.backend
        )
        o = torch.einsum("nhr,hvr->nhv", o_lat.float(), w[:, self.nope :])
        return F.pad(o, (0, self.d - self.v_dim)).to(q.dtype)

    def output(self, o: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
        """o ``[T, H, nope + rope]`` (the padded value width), gate ``[T, H]`` or None -> ``[T, D]``."""
        if gate is not None:
            o = o * torch.sigmoid(gate.float()).to(o.dtype)[..., None]
        return self.o_proj(o[..., : self.v_dim].reshape(o.shape[0], self.hq * self.v_dim))
