"""Full-attention token mixer: GQA, optional output gate and per-head q/k RMSNorm, partial RoPE.

Covers Qwen3.5 / Qwen3-Next gated attention and plain Llama attention. Stages are exposed
(``qkv`` / ``rotate`` / ``attend`` / ``output``) because HYPIC combine splices cached keys
between them. Keys in a ``RequestState`` are stored rotated at their positions; a
``SegmentEntry`` stores them un-rotated (``qkv`` output) so they can be placed anywhere. What is
cached per token is ``qkv``'s k and v (rows ``k_row`` / ``v_row``): per-head K and V here, MLA's
latent form in ``mla.MLAttention``, whose ``attend`` / ``paged_decode`` expand or absorb it.
"""

from __future__ import annotations

import torch
from torch import nn

from hypic_agent.kernels import attention as attn_ops
from hypic_agent.kernels import rope as rope_ops
from hypic_agent.runtime.models.config import HybridConfig
from hypic_agent.runtime.models.layers.norms import RMSNorm


class FullAttention(nn.Module):
    def __init__(self, cfg: HybridConfig) -> None:
        super().__init__()
        self.hq = cfg.num_attention_heads
        self.hkv = cfg.num_key_value_heads
        self.d = cfg.head_dim
        self.gated = cfg.attn_output_gate
        self.rotary_dim = cfg.rotary_dim
        self.theta = cfg.rope_theta
        self.scale = cfg.attention_scale if cfg.attention_scale is not None else self.d**-0.5
        self.backend = "auto"
        self.k_row, self.v_row = cfg.attention_cache_rows  # (heads, width) of one cached key / value
        hidden, bias = cfg.hidden_size, cfg.attention_bias
        self.q_proj = nn.Linear(hidden, self.hq * self.d * (2 if self.gated else 1), bias=bias)
        self.k_proj = nn.Linear(hidden, self.hkv * self.d, bias=bias)
        self.v_proj = nn.Linear(hidden, self.hkv * self.d, bias=bias)
        self.o_proj = nn.Linear(self.hq * self.d, hidden, bias=bias)
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.d, cfg.rms_norm_eps, cfg.norm_zero_centered)
            self.k_norm = RMSNorm(self.d, cfg.rms_norm_eps, cfg.norm_zero_centered)

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """x ``[T, D_model]`` -> un-rotated q ``[T, Hq, D]``, k ``[T, Hkv, D]``, v ``[T, Hkv, D]``,
        gate ``[T, Hq*D]`` or None."""
        t = x.shape[0]
        gate = None
        if self.gated:
            qg = self.q_proj(x).view(t, self.hq, 2 * self.d)
            q, gate_h = torch.chunk(qg, 2, dim=-1)
            gate = gate_h.reshape(t, self.hq * self.d)
        else:
            q = self.q_proj(x).view(t, self.hq, self.d)
        k = self.k_proj(x).view(t, self.hkv, self.d)
        v = self.v_proj(x).view(t, self.hkv, self.d)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v, gate

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Apply RoPE at ``positions [T]`` to x ``[T, H, D]`` (none without rotary dims: Granite 4)."""
        if self.rotary_dim == 0:
            return x
        return rope_ops.apply_rope(x, positions, rotary_dim=self.rotary_dim, theta=self.theta)

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
        """Rotated q ``[Tq, Hq, D]`` over rotated k / v ``[Tk, Hkv, D]`` -> ``[Tq, Hq, D]``
        (``keys_ascending``: see ``kernels.attention.attention``)."""
        return attn_ops.attention(
            q,
            k,
            v,
            cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_k=cu_seqlens_k,
            q_positions=q_positions,
            k_positions=k_positions,
            scale=self.scale,
            backend=self.backend,
            keys_ascending=keys_ascending,
        )

    def paged_decode(
        self,
        q: torch.Tensor,
        k_pages: torch.Tensor,
        v_pages: torch.Tensor,
        block_table: torch.Tensor,
        context_lens: torch.Tensor,
    ) -> torch.Tensor:
        """One rotated query per sequence ``[N, Hq, D]`` over its pooled pages (``[P, page, *k_row]``,
        ``[P, page, *v_row]``) through the block table -> ``[N, Hq, D]`` (the paged kernel)."""
        from hypic_agent.kernels.paged_attention import paged_decode_attention

        return paged_decode_attention(
            q, k_pages, v_pages, block_table, context_lens, scale=self.scale, backend=self.backend
        )

    def output(self, o: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
        """o ``[T, Hq, D]`` -> ``[T, D_model]``."""
        o = o.reshape(o.shape[0], self.hq * self.d)
        if gate is not None:
            o = o * torch.sigmoid(gate)
        return self.o_proj(o)
