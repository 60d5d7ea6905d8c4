"""Mamba2 token mixer (Granite 4 / ``granitemoehybrid`` SSM layers).

Per token: ``in_proj`` -> (z ``[inner]``, xBC ``[C]``, dt ``[H]``); causal depthwise conv over xBC
(kernel W, bias, SiLU) -> x ``[H, P]``, B, C ``[G, N]``; ``dt = softplus(dt + dt_bias)`` (clamped to
``time_step_limit``), ``A = -exp(A_log)``; the SSM per head ``S_t = exp(dt A) S_{t-1} + dt x B^T``,
``y = C S_t + D x``; gated group RMSNorm ``w * rms_G(y * silu(z))`` -> ``out_proj``.

The state is kept in the fla layout ``[H, N, P]`` (keys = B, values = x) so the pool, the entries
and the combine handle it like a GDN state; its transition is a per-head scalar, so a segment's
pair is ``T [H]`` (the cumulative decay) and ``S [H, N, P]`` (``decay_mixer.DecayMixer``,
``kernels.decay_attention``).

The stages follow the linear-mixer protocol (``linear_mixer.LinearMixer``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from hypic_agent.kernels import conv as conv_ops
from hypic_agent.kernels import decay_attention as decay_ops
from hypic_agent.kernels.conv_decode import conv_decode_slots
from hypic_agent.runtime.models.config import HybridConfig
from hypic_agent.runtime.models.layers.decay_mixer import DecayMixer


@dataclass
class Mamba2Operands:
    """Operands of the SSM for T packed tokens (after the conv)."""

    x: torch.Tensor  # [T, H, P]
    B: torch.Tensor  # [T, G, N] keys
    C: torch.Tensor  # [T, G, N] queries
    g: torch.Tensor  # [T, H] log-decay dt * A (fp32)
    dt: torch.Tensor  # [T, H] fp32


class GroupGatedRMSNorm(nn.Module):
    """Mamba2's gated norm: ``w * rms_G(y * silu(z))``, gate first, RMS over each of G channel groups.
    y, z ``[T, inner]``."""

    def __init__(self, dim: int, groups: int, eps: float) -> None:
        super().__init__()
        self.groups = groups
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        t = y.shape[0]
        grp = (y.float() * F.silu(z.float())).view(t, self.groups, -1)
        grp = grp * torch.rsqrt(grp.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * grp.view(t, -1).to(y.dtype)


class Mamba2Mixer(DecayMixer):
    kind = "mamba2"

    def __init__(self, cfg: HybridConfig) -> None:
        super().__init__()
        self.g_heads = cfg.linear_num_key_heads  # groups of B / C
        self.hv = cfg.linear_num_value_heads
        self.dk = cfg.linear_key_head_dim  # d_state
        self.dv = cfg.linear_value_head_dim  # head_dim
        self.inner = self.hv * self.dv
        self.conv_dim = cfg.linear_conv_dim
        self.kernel = cfg.linear_conv_kernel_dim
        self.dt_limit = cfg.linear_dt_limit
        self.backend = "auto"
        d = cfg.hidden_size
        self.in_proj = nn.Linear(d, self.inner + self.conv_dim + self.hv, bias=cfg.linear_proj_bias)
        self.conv1d = nn.Conv1d(
            self.conv_dim, self.conv_dim, self.kernel, groups=self.conv_dim, bias=cfg.linear_conv_bias,
            padding=self.kernel - 1,
        )  # fmt: skip
        self.dt_bias = nn.Parameter(torch.ones(self.hv))
        self.A_log = nn.Parameter(torch.zeros(self.hv))
        self.D = nn.Parameter(torch.ones(self.hv))
        self.norm = GroupGatedRMSNorm(self.inner, self.g_heads, cfg.rms_norm_eps)
        self.out_proj = nn.Linear(self.inner, d, bias=cfg.linear_out_bias)

    # ------------------------------------------------------------------ stages
    def conv_weight(self) -> torch.Tensor:
        """``[C, W]``"""
        return self.conv1d.weight.squeeze(1)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """x ``[T, D]`` -> ``in_proj(x)`` ``[T, inner + C + H]`` (z, xBC, dt; Falcon-H1 scales it)."""
        return self.in_proj(x)

    def inputs(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """x ``[T, D]`` -> (xBC ``[T, C]`` before the conv, z ``[T, inner]``, g ``[T, H]`` fp32, dt ``[T, H]`` fp32)."""
        z, xbc, dt = torch.split(self.project(x), [self.inner, self.conv_dim, self.hv], dim=-1)
        dt = F.softplus(dt.float() + self.dt_bias.float())
        lo, hi = self.dt_limit
        if lo > 0.0 or hi < float("inf"):
            dt = dt.clamp(lo, hi)
        g = dt * -self.A_log.float().exp()
        return xbc, z, g, dt

    def split(self, xbc: torch.Tensor, g: torch.Tensor, dt: torch.Tensor) -> Mamba2Operands:
        t, gn = xbc.shape[0], self.g_heads * self.dk
        x, B, C = torch.split(xbc, [self.inner, gn, gn], dim=-1)
        return Mamba2Operands(
            x.reshape(t, self.hv, self.dv), B.reshape(t, self.g_heads, self.dk), C.reshape(t, self.g_heads, self.dk),
            g, dt,
        )  # fmt: skip

    def convolve(
        self,
        xbc: torch.Tensor,
        z: torch.Tensor,
        g: torch.Tensor,
        dt: torch.Tensor,
        cu_seqlens: torch.Tensor | None,
        conv_state: torch.Tensor | None,
    ) -> tuple[Mamba2Operands, torch.Tensor]:
        """-> (operands, final conv state ``[N, C, W-1]``)."""
        out, conv_final = conv_ops.causal_conv1d(
            xbc, self.conv_weight(), self.conv1d.bias, cu_seqlens=cu_seqlens, initial_state=conv_state,
            activation="silu", backend=self.backend,
        )  # fmt: skip
        return self.split(out, g, dt), conv_final

    def decay_operands(self, ops: Mamba2Operands) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """q = C, k = B, v = dt * x, g = dt * A."""
        return ops.C, ops.B, ops.x.float() * ops.dt[..., None], ops.g

    def finish(self, o: torch.Tensor, ops: Mamba2Operands) -> torch.Tensor:
        """The D skip: ``y = C S + D x`` ``[T, H, P]``."""
        return (o + self.D.float()[:, None] * ops.x.float()).to(ops.x.dtype)

    def output(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """y ``[T, H, P]``, z ``[T, inner]`` -> ``[T, D]``: gate, then RMSNorm per group of B/C."""
        return self.out_proj(self.norm(o.reshape(o.shape[0], self.inner), z))

    # ------------------------------------------------------------------ decode
    def step(
        self, x: torch.Tensor, state: torch.Tensor, conv_state: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One token per sequence: x ``[N, D]``, state ``[N, H, N_state, P]``, conv ``[N, C, W-1]``."""
        xbc, z, g, dt = self.inputs(x)
        out, conv_new = conv_ops.causal_conv1d_step(
            xbc, conv_state, self.conv_weight(), self.conv1d.bias, activation="silu"
        )
        ops = self.split(out, g, dt)
        q, k, v, g = self.decay_operands(ops)
        o, new = decay_ops.decay_step(q, k, v, g, state)
        return self.output(self.finish(o, ops), z), new, conv_new

    def decode_slots(
        self, inputs: tuple[torch.Tensor, ...], conv_pool: torch.Tensor, rec_pool: torch.Tensor, slots: torch.Tensor
    ) -> torch.Tensor:
        """Decode rows against their pool slots (updated in place) -> y ``[N, H, P]``."""
        xbc, _, g, dt = inputs
        out = conv_decode_slots(
            xbc, conv_pool, slots, self.conv_weight(), self.conv1d.bias, activation="silu", backend=self.backend
        )
        return self.step_slots(self.split(out, g, dt), rec_pool, slots)
