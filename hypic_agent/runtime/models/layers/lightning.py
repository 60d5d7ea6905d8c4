"""MiniMax's Lightning attention: decay-only linear attention with a fixed decay per head.

Per token: ``silu(qkv_proj(x))`` -> q, k, v ``[H, D]`` (per head contiguous); the state advances as
``S_t = exp(-s_h) S_{t-1} + k v^T`` with a constant slope ``s_h`` per head and layer (ALiBi-style:
``(2^(-8/H))^(h+1) * (1 - layer / (L-1))``), ``o = q S_t`` (no scale); RMSNorm over all heads, times
``sigmoid(output_gate(x))``, ``out_proj``. No conv (the conv tail is empty: kernel 1).

A span's pair is ``T [H] = exp(-s n)`` and ``S [H, D, D]`` (``decay_mixer.DecayMixer``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hypic_agent.kernels import decay_attention as decay_ops
from hypic_agent.runtime.models.config import HybridConfig
from hypic_agent.runtime.models.layers.decay_mixer import DecayMixer
from hypic_agent.runtime.models.layers.norms import RMSNorm

LightningOperands = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # q, k, v [T, H, D]


def lightning_slopes(heads: int, layer: int, num_layers: int) -> list[float]:
    """transformers' ``MiniMaxLightningAttention.get_slope_rate`` per head."""
    base = 1 / (2 ** (8 / heads))
    factor = 1 - layer / (num_layers - 1 + 1e-5) + 1e-5
    return [base ** (h + 1) * factor for h in range(heads)]


class LightningAttention(DecayMixer):
    kind = "lightning"

    def __init__(self, cfg: HybridConfig, layer: int) -> None:
        super().__init__()
        if cfg.hidden_act != "silu":
            raise ValueError(f"Lightning attention with hidden_act {cfg.hidden_act!r} is not supported")
        self.h = self.hv = cfg.linear_num_value_heads
        self.dk = self.dv = cfg.linear_value_head_dim
        self.conv_dim, self.kernel = 0, 1
        self.backend = "auto"
        inner, d = self.hv * self.dv, cfg.hidden_size
        self.qkv_proj = nn.Linear(d, 3 * inner, bias=False)
        self.out_proj = nn.Linear(inner, d, bias=False)
        self.output_gate = nn.Linear(d, inner, bias=False)
        self.norm = RMSNorm(inner, 1e-6, zero_centered=False)  # transformers' default eps here
        self.slopes = lightning_slopes(self.hv, layer, cfg.num_layers)

    def inputs(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x ``[T, D]`` -> (qkv ``[T, H, 3D]`` after SiLU, output gate logits ``[T, H*D]``)."""
        return F.silu(self.qkv_proj(x)).view(x.shape[0], self.hv, 3 * self.dv), self.output_gate(x)

    def convolve(
        self, qkv: torch.Tensor, gate: torch.Tensor, cu_seqlens: torch.Tensor | None, conv_state: torch.Tensor | None
    ) -> tuple[LightningOperands, torch.Tensor]:
        """No conv: -> ((q, k, v) ``[T, H, D]`` each, empty conv states ``[N, 0, 0]``)."""
        n = 1 if cu_seqlens is None else cu_seqlens.numel() - 1
        q, k, v = torch.split(qkv, self.dv, dim=-1)
        return (q, k, v), qkv.new_zeros(n, 0, 0)

    def decay_operands(self, ops: LightningOperands) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = ops
        return q, k, v, self.slope_log_decays(q)

    def finish(self, o: torch.Tensor, ops: LightningOperands) -> torch.Tensor:
        return o.to(ops[2].dtype)

    def output(self, o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """o ``[T, H, D]``, gate ``[T, H*D]`` -> ``[T, D_model]``."""
        y = self.norm(o.reshape(o.shape[0], -1))
        return self.out_proj(torch.sigmoid(gate) * y)

    def step(
        self, x: torch.Tensor, state: torch.Tensor, conv_state: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One token per sequence: x ``[N, D]``, state ``[N, H, D, D]``, conv ``[N, 0, 0]``."""
        qkv, gate = self.inputs(x)
        ops, _ = self.convolve(qkv, gate, None, None)
        q, k, v, g = self.decay_operands(ops)
        o, new = decay_ops.decay_step(q, k, v, g, state)
        return self.output(self.finish(o, ops), gate), new, conv_state

    def decode_slots(
        self, inputs: tuple[torch.Tensor, ...], conv_pool: torch.Tensor, rec_pool: torch.Tensor, slots: torch.Tensor
    ) -> torch.Tensor:
        """Decode rows against their pool slots' states (updated in place) -> o ``[N, H, D]``."""
        ops, _ = self.convolve(inputs[0], inputs[1], None, None)
        return self.step_slots(ops, rec_pool, slots)
