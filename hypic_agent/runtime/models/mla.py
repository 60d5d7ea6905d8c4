"""Multi-head latent attention as Kimi Linear (NoPE) and Ling 3 (RoPE, a head gate) run it.

q ``[H, nope + rope]`` from ``q_proj`` (or the low-rank ``q_a`` / ``q_b`` pair); the compressed KV
``kv_a_proj_with_mqa(x)`` = latent ``[r]`` (RMSNorm'd) + a shared key part ``[rope]``; ``kv_b_proj``
expands the latent to per-head ``k_nope`` and ``v``; a head's key is ``[k_nope | k_shared]``. No
position encoding in Kimi Linear ("NoPE"); Ling 3 (``bailing_hybrid``) rotates the rope part of q and
the shared key (DeepSeek's interleaved pairs) and gates each head's output by ``sigmoid(g_proj(x))``.

The runtime stores per-head keys and values of one width (``head_dim = nope + rope``): values are
zero-padded from ``v_head_dim`` and the output sliced back, so the pool, the entries and every
attention kernel work unchanged (at the cost of caching the expanded K / V, not the latent).
"""

from __future__ import annotations

import torch
from torch import nn

from hypic_agent.runtime.models.attention import FullAttention
from hypic_agent.runtime.models.config import HybridConfig
from hypic_agent.runtime.models.norms import RMSNorm


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
        """x ``[T, D]`` -> q, k ``[T, H, nope + rope]``, v ``[T, H, nope + rope]`` (zero-padded), no gate."""
        t = x.shape[0]
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))) if self.q_lora else self.q_proj(x)
        latent, k_shared = torch.split(self.kv_a_proj_with_mqa(x), [self.rank, self.rope], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(latent)).view(t, self.hq, self.nope + self.v_dim)
        k_nope, v = torch.split(kv, [self.nope, self.v_dim], dim=-1)
        k_rope = k_shared[:, None, :].expand(t, self.hq, self.rope)
        q = q.view(t, self.hq, self.d)
        v = torch.nn.functional.pad(v, (0, self.d - self.v_dim))
        gate = self.g_proj(x) if self.g_proj is not None else None
        if not self.rotary_dim:
            return q, torch.cat([k_nope, k_rope], dim=-1), v, gate
        # RoPE'd: heads laid out [rope | nope] (a permutation of both q and k: same scores) with the rope
        # part de-interleaved, so the rotate-half RoPE on the first rotary dims = DeepSeek's interleaved one
        q_nope, q_rope = torch.split(q, [self.nope, self.rope], dim=-1)
        q = torch.cat([q_rope[..., 0::2], q_rope[..., 1::2], q_nope], dim=-1)
        k = torch.cat([k_rope[..., 0::2], k_rope[..., 1::2], k_nope], dim=-1)
        return q, k, v, gate

    def output(self, o: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
        """o ``[T, H, nope + rope]`` (the padded value width), gate ``[T, H]`` or None -> ``[T, D]``."""
        if gate is not None:
            o = o * torch.sigmoid(gate.float()).to(o.dtype)[..., None]
        return self.o_proj(o[..., : self.v_dim].reshape(o.shape[0], self.hq * self.v_dim))
