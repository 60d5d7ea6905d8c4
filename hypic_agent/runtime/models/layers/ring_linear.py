"""Ring-linear's linear attention (``lightning_rope``): Lightning with RoPE applied *inside* the layer.

The linear layers of inclusionAI's Ring-mini/flash-linear-2.0 (``bailing_moe_linear``; the math as in
vLLM's ``BailingMoELinearAttention``). Per token: ``query_key_value(x)`` -> q, k, v ``[H, D]`` (heads
contiguous: ``[q | k | v]``), optionally SiLU, per-head RMSNorm of q and k, partial NeoX RoPE of q and
k at the token's position (``rotary_dim`` first dims, the attention layers' theta), ``q * D^-0.5``;
the state advances as ``S_t = exp(-s_h) S_{t-1} + k_t v_t^T`` with a fixed ALiBi slope per head and
layer, ``o_t = q_t S_t``; a grouped RMSNorm (``group_norm_size`` groups over ``H*D``) times
``sigmoid(g_proj(x))``, ``dense``. No conv.

The keys enter the state rotated at their positions, so a segment's cached S built at local
positions 0..n-1 is placed at a global offset P by ``R(P) S`` (``kernels.state_rope``; T is a decay
per head and does not change). ``convolve`` / ``step`` / ``decode_slots`` take the rows' positions
(``positional = True``; the layer loops pass them through ``linear_mixer.convolve_at``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from hypic_agent.kernels import decay_attention as decay_ops
from hypic_agent.kernels import rope as rope_ops
from hypic_agent.kernels.state_rope import rotate_state
from hypic_agent.runtime.models.config import HybridConfig
from hypic_agent.runtime.models.layers.decay_mixer import DecayMixer
from hypic_agent.runtime.models.layers.norms import RMSNorm

RingOperands = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # rotated, scaled q; rotated k; v [T, H, D]


def alibi_slopes(n: int) -> list[float]:
    """ALiBi slopes of ``n`` heads (MiniMax's ``_build_slope_tensor``; non-powers of 2 interleaved)."""

    def pow2(m: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(m) - 3)))
        return [start * start**i for i in range(m)]

    if math.log2(n).is_integer():
        return pow2(n)
    c = 2 ** math.floor(math.log2(n))
    return pow2(c) + alibi_slopes(2 * c)[0::2][: n - c]


def ring_slopes(heads: int, layer: int, num_layers: int) -> list[float]:
    """Per-head decay rates ``s_h`` of linear layer ``layer`` (vLLM's ``BailingMoELinearAttention``)."""
    factor = (1 + 1e-5) if num_layers <= 1 else (1 - layer / (num_layers - 1) + 1e-5)
    return [s * factor for s in alibi_slopes(heads)]


class RingLinearAttention(DecayMixer):
    kind = "lightning_rope"
    positional = True

    def __init__(self, cfg: HybridConfig, layer: int) -> None:
        super().__init__()
        self.h = self.hv = cfg.linear_num_value_heads
        self.dk = self.dv = cfg.linear_value_head_dim
        self.conv_dim, self.kernel = 0, 1
        self.backend = "auto"
        self.rotary_dim, self.theta = cfg.rotary_dim, cfg.rope_theta
        self.silu = cfg.linear_silu
        self.groups = cfg.linear_group_norm
        inner, d = self.hv * self.dv, cfg.hidden_size
        self.query_key_value = nn.Linear(d, 3 * inner, bias=cfg.linear_proj_bias)
        self.g_proj = nn.Linear(d, inner, bias=False)
        self.dense = nn.Linear(inner, d, bias=cfg.linear_out_bias)
        self.g_norm = RMSNorm(inner, cfg.rms_norm_eps, zero_centered=False)  # applied per group
        self.query_layernorm: RMSNorm | None = None
        self.key_layernorm: RMSNorm | None = None
        if cfg.linear_qk_norm:
            self.query_layernorm = RMSNorm(self.dk, cfg.rms_norm_eps, zero_centered=False)
            self.key_layernorm = RMSNorm(self.dk, cfg.rms_norm_eps, zero_centered=False)
        self.slopes = ring_slopes(self.hv, layer, cfg.num_layers)

    def place(self, S: torch.Tensor, offset: int) -> torch.Tensor:
        """A state ``[HV, K, V]`` built at local positions 0.. -> the same tokens' state at ``offset`` + local:
        ``R(offset) S`` (fp32; ``kernels.state_rope``)."""
        return rotate_state(S, offset, rotary_dim=self.rotary_dim, theta=self.theta)

    def inputs(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x ``[T, D]`` -> (q, k, v un-rotated ``[T, 3, H, D]`` fp32 after SiLU / qk-norm, gate logits ``[T, H*D]``)."""
        t = x.shape[0]
        qkv = self.query_key_value(x).float()
        if self.silu:
            qkv = F.silu(qkv)
        q, k, v = qkv.view(t, 3, self.hv, self.dk).unbind(1)
        if self.query_layernorm is not None and self.key_layernorm is not None:
            q, k = self.query_layernorm(q), self.key_layernorm(k)
        return torch.stack([q, k, v], dim=1), self.g_proj(x)

    def convolve(
        self,
        qkv: torch.Tensor,
        gate: torch.Tensor,
        cu_seqlens: torch.Tensor | None,
        conv_state: torch.Tensor | None,
        *,
        positions: torch.Tensor,
    ) -> tuple[RingOperands, torch.Tensor]:
        """No conv; RoPE at ``positions [T]`` -> ((q * D^-0.5, k) rotated, v: ``[T, H, D]`` fp32; empty
        conv states ``[N, 0, 0]``)."""
        n = 1 if cu_seqlens is None else cu_seqlens.numel() - 1
        q, k, v = qkv.unbind(1)
        rd, theta = self.rotary_dim, self.theta
        q = rope_ops.apply_rope(q, positions, rotary_dim=rd, theta=theta) * self.dk**-0.5
        k = rope_ops.apply_rope(k, positions, rotary_dim=rd, theta=theta)
        return (q, k, v), qkv.new_zeros(n, 0, 0)

    def decay_operands(self, ops: RingOperands) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = ops
        return q, k, v, self.slope_log_decays(q)

    def output(self, o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """o ``[T, H, D]`` fp32, gate ``[T, H*D]`` -> ``[T, D_model]``: per-group RMSNorm, sigmoid gate, dense."""
        t = o.shape[0]
        y = o.float().reshape(t, self.groups, -1)
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.g_norm.eps)
        y = y.reshape(t, -1) * self.g_norm.weight.float()
        return self.dense((torch.sigmoid(gate.float()) * y).to(gate.dtype))

    def step(
        self, x: torch.Tensor, state: torch.Tensor, conv_state: torch.Tensor, *, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One token per sequence at ``positions [N]``: x ``[N, D]``, state ``[N, H, D, D]``, conv ``[N, 0, 0]``."""
        qkv, gate = self.inputs(x)
        ops, _ = self.convolve(qkv, gate, None, None, positions=positions)
        q, k, v, g = self.decay_operands(ops)
        o, new = decay_ops.decay_step(q, k, v, g, state)
        return self.output(o, gate), new, conv_state

    def decode_slots(
        self,
        inputs: tuple[torch.Tensor, ...],
        conv_pool: torch.Tensor,
        rec_pool: torch.Tensor,
        slots: torch.Tensor,
        *,
        positions: torch.Tensor,
    ) -> torch.Tensor:
        """Decode rows at ``positions [N]`` against their pool slots' states (updated in place) -> o ``[N, H, D]``."""
        ops, _ = self.convolve(inputs[0], inputs[1], None, None, positions=positions)
        return self.step_slots(ops, rec_pool, slots)
