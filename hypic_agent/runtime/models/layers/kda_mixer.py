"""Kimi Delta Attention token mixer (Kimi Linear's linear layers).

Per token: q, k, v projections -> one causal depthwise conv over their concatenation (kernel W,
SiLU); a per-key-channel log-decay ``g = -exp(A_log_h) * softplus(f_b(f_a(x)) + dt_bias)``
``[H, K]``, ``beta = sigmoid(b_proj(x))``; the KDA recurrence (``kernels.kda``: fla-core's kernels
on CUDA, the torch twin elsewhere) over a ``[H, K, V]`` state; RMSNorm per head times
``sigmoid(g_b(g_a(x)))`` -> ``o_proj``.

Ling 3 (``bailing_hybrid``, ``kda_variant = "ling"``) has the same layer with full-rank gates:
``f_proj`` (forget gate ``lower_bound * sigmoid(exp(A_log) * (f + dt_bias))``) and ``g_proj``.

Its transition mixes key channels (a delta rule), so its pairs are dense ``T [H, K, K]`` like GDN's
and compose with ``kernels.chain``. The stages follow ``linear_mixer.LinearMixer``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hypic_agent.kernels import chain as chain_ops
from hypic_agent.kernels import conv as conv_ops
from hypic_agent.kernels import kda as kda_ops
from hypic_agent.kernels.config import DEFAULT_KERNELS, KernelConfig
from hypic_agent.kernels.conv_decode import conv_decode_slots
from hypic_agent.kernels.gdn_pairs import PairSink, SeamSplit
from hypic_agent.runtime.models.config import HybridConfig


@dataclass
class KDAOperands:
    q: torch.Tensor  # [T, H, K]
    k: torch.Tensor  # [T, H, K]
    v: torch.Tensor  # [T, H, V]
    g: torch.Tensor  # [T, H, K] log-decay (fp32)
    beta: torch.Tensor  # [T, H]


class ForgetGate(nn.Module):
    """``-exp(A_log) * softplus(f_b(f_a(x)) + dt_bias)`` -> ``[T, H, K]`` fp32 (transformers' names)."""

    def __init__(self, d: int, heads: int, head_dim: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.f_a_proj = nn.Linear(d, head_dim, bias=False)
        self.f_b_proj = nn.Linear(head_dim, heads * head_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.zeros(heads * head_dim))
        self.A_log = nn.Parameter(torch.zeros(1, 1, heads, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = (self.f_b_proj(self.f_a_proj(x)).float() + self.dt_bias.float()).view(-1, self.heads, self.head_dim)
        sp = torch.where(f > 20.0, f, torch.log1p(torch.exp(f)))
        return -self.A_log.float().exp().view(1, self.heads, 1) * sp


class LingForgetGate(nn.Module):
    """Ling 3's gate: ``f = f_proj(x) + dt_bias``; ``lower_bound * sigmoid(exp(A_log) * f)`` (bounded) or
    ``-exp(A_log) * softplus(f)`` (``lower_bound`` None) -> ``[T, H, K]`` fp32 (transformers' names)."""

    def __init__(self, d: int, heads: int, head_dim: int, lower_bound: float | None) -> None:
        super().__init__()
        self.heads, self.head_dim, self.lower_bound = heads, head_dim, lower_bound
        self.f_proj = nn.Linear(d, heads * head_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.zeros(heads * head_dim))
        self.A_log = nn.Parameter(torch.zeros(heads))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = (self.f_proj(x).float() + self.dt_bias.float()).view(-1, self.heads, self.head_dim)
        rate = self.A_log.float().exp().view(1, self.heads, 1)
        if self.lower_bound is not None:
            return self.lower_bound * torch.sigmoid(rate * f)
        return -rate * torch.where(f > 20.0, f, torch.log1p(torch.exp(f)))


class HeadNorm(nn.Module):
    """The output norm's weight ``[V]`` (``o_norm``; applied in ``KimiDeltaAttention.output``)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))


class KimiDeltaAttention(nn.Module):
    kind = "kda"
    kernels: KernelConfig = DEFAULT_KERNELS  # ``recurrent_scan_max_tokens`` (``HybridForCausalLM.set_kernels``)

    def __init__(self, cfg: HybridConfig) -> None:
        super().__init__()
        self.h = self.hv = cfg.linear_num_value_heads
        self.dk = self.dv = cfg.linear_value_head_dim
        self.inner = self.hv * self.dv
        self.conv_dim = cfg.linear_conv_dim  # q, k, v
        self.kernel = cfg.linear_conv_kernel_dim
        self.eps = cfg.rms_norm_eps
        self.backend = "auto"
        d = cfg.hidden_size
        self.q_proj = nn.Linear(d, self.inner, bias=False)
        self.k_proj = nn.Linear(d, self.inner, bias=False)
        self.v_proj = nn.Linear(d, self.inner, bias=False)
        self.conv1d = nn.Conv1d(
            self.conv_dim, self.conv_dim, self.kernel, groups=self.conv_dim, bias=False, padding=self.kernel - 1
        )
        self.b_proj = nn.Linear(d, self.hv, bias=False)
        self.ling = cfg.kda_variant == "ling"  # Ling 3: full-rank forget and output gates
        self.forget_gate: nn.Module
        if self.ling:
            self.forget_gate = LingForgetGate(d, self.hv, self.dv, cfg.kda_lower_bound)
            self.g_proj = nn.Linear(d, self.inner, bias=False)
        else:
            self.forget_gate = ForgetGate(d, self.hv, self.dv)
            self.g_a_proj = nn.Linear(d, self.dv, bias=False)
            self.g_b_proj = nn.Linear(self.dv, self.inner, bias=False)
        self.o_norm = HeadNorm(self.dv)
        self.o_proj = nn.Linear(self.inner, d, bias=False)

    def conv_weight(self) -> torch.Tensor:
        return self.conv1d.weight.squeeze(1)

    def inputs(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """x ``[T, D]`` -> (q|k|v ``[T, 3 H K]`` before the conv, output gate ``[T, H, V]``, g ``[T, H, K]``
        fp32, beta ``[T, H]``)."""
        mixed = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        gate = (self.g_proj(x) if self.ling else self.g_b_proj(self.g_a_proj(x))).view(x.shape[0], self.hv, self.dv)
        return mixed, gate, self.forget_gate(x), torch.sigmoid(self.b_proj(x))

    def _split(self, qkv: torch.Tensor, g: torch.Tensor, beta: torch.Tensor) -> KDAOperands:
        t = qkv.shape[0]
        q, k, v = (x.reshape(t, self.hv, self.dv) for x in torch.split(qkv, self.inner, dim=-1))
        return KDAOperands(q, k, v, g, beta)

    def convolve(
        self,
        mixed: torch.Tensor,
        gate: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        cu_seqlens: torch.Tensor | None,
        conv_state: torch.Tensor | None,
    ) -> tuple[KDAOperands, torch.Tensor]:
        out, conv_final = conv_ops.causal_conv1d(
            mixed, self.conv_weight(), None, cu_seqlens=cu_seqlens, initial_state=conv_state, activation="silu",
            backend=self.backend,
        )  # fmt: skip
        return self._split(out, g, beta), conv_final

    def mix(
        self, ops: KDAOperands, cu_seqlens: torch.Tensor | None, initial_state: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (o ``[T, H, V]``, final states ``[N, H, K, V]`` fp32)."""
        o, final = kda_ops.kda(
            ops.q, ops.k, ops.v, ops.g, ops.beta, cu_seqlens=cu_seqlens, initial_state=initial_state,
            backend=self.backend, recurrent_max_tokens=self.kernels.recurrent_scan_max_tokens,
        )  # fmt: skip
        return o.to(ops.v.dtype), final

    def mix_into_pairs(
        self, ops: KDAOperands, cu_seqlens: torch.Tensor, split: SeamSplit, sink: PairSink
    ) -> torch.Tensor:
        """Isolated segments from zero states -> o; each body's pair into ``sink`` (no body: ``(I, 0)``)."""
        o, _ = self.mix(ops, cu_seqlens, None)
        idx = split.body_idx
        T, S = kda_ops.kda_pairs(
            ops.k[idx], ops.v[idx], ops.g[idx], ops.beta[idx], cu_seqlens=split.cu_body, backend=self.backend
        )
        eye = torch.eye(self.dk, device=o.device)
        for j in range(split.n):
            sink.T[j].copy_(eye.expand(self.hv, self.dk, self.dk))
            sink.S[j].zero_()
        for row, seg in enumerate(split.body_segs):
            sink.T[seg].copy_(T[row])
            sink.S[seg].copy_(S[row])
        return o

    def mix_after_pairs(
        self, ops: KDAOperands, cu_seqlens: torch.Tensor, enter: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        T, S = kda_ops.kda_pairs(
            ops.k, ops.v, ops.g, ops.beta, cu_seqlens=cu_seqlens, backend=self.backend,
            recurrent_max_tokens=self.kernels.recurrent_scan_max_tokens,
        )  # fmt: skip
        return self.mix(ops, cu_seqlens, enter(T, S))

    def pair_identity(self, like: torch.Tensor) -> torch.Tensor:
        return torch.eye(self.dk, device=like.device, dtype=torch.float32).expand(self.hv, self.dk, self.dk)

    def compose(self, h0: torch.Tensor, T: torch.Tensor, S: torch.Tensor) -> torch.Tensor:
        return chain_ops.chain_scan(h0, T, S, backend=self.backend)

    def output(self, o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """o, gate ``[T, H, V]`` -> ``[T, D]``: RMSNorm per head (fp32) times ``sigmoid(gate)``."""
        y = o.float() * torch.rsqrt(o.float().pow(2).mean(-1, keepdim=True) + self.eps)
        y = self.o_norm.weight.float() * y * torch.sigmoid(gate.float())
        return self.o_proj(y.to(o.dtype).reshape(o.shape[0], self.inner))

    def step(
        self, x: torch.Tensor, state: torch.Tensor, conv_state: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        mixed, gate, g, beta = self.inputs(x)
        out, conv_new = conv_ops.causal_conv1d_step(mixed, conv_state, self.conv_weight(), None, activation="silu")
        ops = self._split(out, g, beta)
        o, new = kda_ops.kda_step(ops.q, ops.k, ops.v, ops.g, ops.beta, state, backend=self.backend)
        return self.output(o.to(x.dtype), gate), new, conv_new

    def decode_slots(
        self, inputs: tuple[torch.Tensor, ...], conv_pool: torch.Tensor, rec_pool: torch.Tensor, slots: torch.Tensor
    ) -> torch.Tensor:
        mixed, _, g, beta = inputs
        out = conv_decode_slots(mixed, conv_pool, slots, self.conv_weight(), None, backend=self.backend)
        ops = self._split(out, g, beta)
        o = kda_ops.kda_decode_slots(ops.q, ops.k, ops.v, ops.g, ops.beta, rec_pool, slots, backend=self.backend)
        return o.to(mixed.dtype)
