"""Gated DeltaNet token mixer (Qwen3.5 / Qwen3-Next linear-attention layers).

Per token: q/k/v projections -> causal depthwise conv (kernel W, SiLU) -> L2-normed q/k,
``beta = sigmoid(b)``, ``g = -exp(A_log) * softplus(a + dt_bias)`` -> gated delta rule over a
``[HV, K, V]`` state per sequence -> gated RMSNorm with ``z`` -> out projection.

The mixer exposes its stages (``operands`` / ``mix`` / ``output``) because HYPIC's entry
building and combine need the per-token operands (k, v, g, beta) between them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from hypic_agent.kernels import chain as chain_ops
from hypic_agent.kernels import combine_scan, gdn_pairs
from hypic_agent.kernels import conv as conv_ops
from hypic_agent.kernels import gdn as gdn_ops
from hypic_agent.kernels.config import DEFAULT_KERNELS
from hypic_agent.kernels.conv_decode import conv_decode_slots
from hypic_agent.kernels.gdn_decode import gdn_decode_slots
from hypic_agent.kernels.gdn_gates import gdn_gates
from hypic_agent.kernels.gdn_pairs import PairSink, SeamSplit
from hypic_agent.runtime.models.config import HybridConfig
from hypic_agent.runtime.models.layers.fused_inputs import FusedInputs, fuse
from hypic_agent.runtime.models.layers.norms import GatedRMSNorm


@dataclass
class GDNOperands:
    """Operands of the recurrence for T packed tokens (after conv)."""

    q: torch.Tensor  # [T, H, K]
    k: torch.Tensor  # [T, H, K]
    v: torch.Tensor  # [T, HV, V]
    g: torch.Tensor  # [T, HV] log-decay (fp32)
    beta: torch.Tensor  # [T, HV]
    z: torch.Tensor  # [T, HV, V] output gate


class GatedDeltaNet(nn.Module):
    kind = "gdn"

    def __init__(self, cfg: HybridConfig) -> None:
        super().__init__()
        self.h = cfg.linear_num_key_heads
        self.hv = cfg.linear_num_value_heads
        self.dk = cfg.linear_key_head_dim
        self.dv = cfg.linear_value_head_dim
        self.key_dim = cfg.linear_key_dim
        self.value_dim = cfg.linear_value_dim
        self.conv_dim = cfg.linear_conv_dim
        self.kernel = cfg.linear_conv_kernel_dim
        self.fused = cfg.linear_fused_qkvz
        self.backend = "auto"
        d = cfg.hidden_size
        if self.fused:
            self.in_proj_qkvz = nn.Linear(d, 2 * self.key_dim + 2 * self.value_dim, bias=False)
            self.in_proj_ba = nn.Linear(d, 2 * self.hv, bias=False)
        else:
            self.in_proj_qkv = nn.Linear(d, self.conv_dim, bias=False)
            self.in_proj_z = nn.Linear(d, self.value_dim, bias=False)
            self.in_proj_b = nn.Linear(d, self.hv, bias=False)
            self.in_proj_a = nn.Linear(d, self.hv, bias=False)
        self.conv1d = nn.Conv1d(
            self.conv_dim, self.conv_dim, self.kernel, groups=self.conv_dim, bias=False, padding=self.kernel - 1
        )
        self.dt_bias = nn.Parameter(torch.ones(self.hv))
        self.A_log = nn.Parameter(torch.zeros(self.hv))
        self.norm = GatedRMSNorm(self.dv, cfg.rms_norm_eps)
        self.out_proj = nn.Linear(self.value_dim, d, bias=False)
        self.fused_in: FusedInputs | None = None

    # ------------------------------------------------------------------ stages
    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """x ``[T, D]`` -> (pre-conv qkv ``[T, C]``, z ``[T, HV, V]``, b ``[T, HV]``, a ``[T, HV]``)."""
        t = x.shape[0]
        if self.fused_in is not None:  # one GEMM (``fuse_inputs``); the conv kernels read contiguous rows
            parts = self.fused_in(x)
            if not self.fused:
                mixed, z, b, a = parts
                return mixed.contiguous(), z.view(t, self.hv, self.dv), b, a
            return self._unpack_qkvz(t, *parts)
        if not self.fused:
            return (
                self.in_proj_qkv(x),
                self.in_proj_z(x).view(t, self.hv, self.dv),
                self.in_proj_b(x),
                self.in_proj_a(x),
            )
        return self._unpack_qkvz(t, self.in_proj_qkvz(x), self.in_proj_ba(x))

    def _unpack_qkvz(
        self, t: int, qkvz: torch.Tensor, ba: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Qwen3-Next's per-key-head interleaved ``in_proj_qkvz`` / ``in_proj_ba`` outputs -> ``project``'s."""
        r = self.hv // self.h
        qkvz = qkvz.view(t, self.h, 2 * self.dk + 2 * r * self.dv)
        q, k, v, z = torch.split(qkvz, [self.dk, self.dk, r * self.dv, r * self.dv], dim=-1)
        ba = ba.view(t, self.h, 2 * r)
        b, a = torch.split(ba, [r, r], dim=-1)
        mixed = torch.cat([q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1)], dim=-1)
        return mixed, z.reshape(t, self.hv, self.dv), b.reshape(t, self.hv), a.reshape(t, self.hv)

    def fuse_inputs(self) -> list[FusedInputs]:
        """The input projections as one GEMM (``fused_inputs``)."""
        names = ("in_proj_qkvz", "in_proj_ba") if self.fused else ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
        self.fused_in = fuse([(getattr(self, n), "weight") for n in names])
        return [self.fused_in]

    def conv_weight(self) -> torch.Tensor:
        """``[C, W]``"""
        return self.conv1d.weight.squeeze(1)

    def gates(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (g ``[T, HV]`` fp32 log-decay, beta ``[T, HV]``): one launch on CUDA (``kernels.gdn_gates``)."""
        return gdn_gates(a, b, self.A_log, self.dt_bias, backend="torch" if self.backend == "torch" else "auto")

    def split(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        t = qkv.shape[0]
        q, k, v = torch.split(qkv, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        return q.reshape(t, self.h, self.dk), k.reshape(t, self.h, self.dk), v.reshape(t, self.hv, self.dv)

    def inputs(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Token-local half of ``operands``: x ``[T, D]`` -> (mixed ``[T, C]`` before the conv, z
        ``[T, HV, V]``, g ``[T, HV]`` fp32, beta ``[T, HV]``)."""
        mixed, z, b, a = self.project(x)
        g, beta = self.gates(a, b)
        return mixed, z, g, beta

    def convolve(
        self,
        mixed: torch.Tensor,
        z: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        cu_seqlens: torch.Tensor | None,
        conv_state: torch.Tensor | None,
    ) -> tuple[GDNOperands, torch.Tensor]:
        """The conv half of ``operands`` (depends on the sequence layout) -> (operands, final conv
        state ``[N, C, W-1]``)."""
        qkv, conv_final = conv_ops.causal_conv1d(
            mixed,
            self.conv_weight(),
            None,
            cu_seqlens=cu_seqlens,
            initial_state=conv_state,
            activation="silu",
            backend=self.backend,
        )
        q, k, v = self.split(qkv)
        return GDNOperands(q, k, v, g, beta, z), conv_final

    def operands(
        self, x: torch.Tensor, cu_seqlens: torch.Tensor | None, conv_state: torch.Tensor | None
    ) -> tuple[GDNOperands, torch.Tensor]:
        """x ``[T, D]`` -> (operands, final conv state ``[N, C, W-1]``)."""
        return self.convolve(*self.inputs(x), cu_seqlens, conv_state)

    def mix(
        self, ops: GDNOperands, cu_seqlens: torch.Tensor | None, initial_state: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Gated delta rule -> (o ``[T, HV, V]``, final state ``[N, HV, K, V]`` fp32)."""
        o, final = gdn_ops.gated_delta_rule(
            ops.q,
            ops.k,
            ops.v,
            ops.g,
            ops.beta,
            cu_seqlens=cu_seqlens,
            initial_state=initial_state,
            output_final_state=True,
            use_qk_l2norm=True,
            backend=self.backend,
        )
        assert final is not None
        return o, final

    def mix_into_pairs(
        self, ops: GDNOperands, cu_seqlens: torch.Tensor, split: SeamSplit, sink: PairSink
    ) -> torch.Tensor:
        """Isolated segments from zero states -> o ``[T, HV, V]``; each segment's body pair goes into
        ``sink`` (the cache entries' tensors); on CUDA one pass shares the WY factors."""
        o, _ = gdn_pairs.gated_delta_rule_into_pairs(
            ops.q, ops.k, ops.v, ops.g, ops.beta, cu_seqlens=cu_seqlens, split=split, sink=sink, use_qk_l2norm=True,
            backend=self.backend,
        )  # fmt: skip
        return o

    def mix_after_pairs(
        self, ops: GDNOperands, cu_seqlens: torch.Tensor, enter: gdn_pairs.EnterFn
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Pieces run from ``enter(their pairs)`` -> (o ``[T, HV, V]``, finals ``[P, HV, K, V]`` fp32)."""
        return gdn_pairs.gated_delta_rule_after_pairs(
            ops.q, ops.k, ops.v, ops.g, ops.beta, cu_seqlens=cu_seqlens, enter=enter, use_qk_l2norm=True,
            backend=self.backend,
        )  # fmt: skip

    def mix_scan(
        self,
        ops: GDNOperands,
        chain: list[combine_scan.ChainLink],
        *,
        transition: bool,
        tables: tuple[combine_scan.ChainTables, int] | None = None,
        h0: torch.Tensor | None = None,
        precise_for_half: bool = DEFAULT_KERNELS.precise_for_half,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Pieces and cached bodies in chain order from ``h0 [HV, K, V]`` (None: zero), fused
        (``kernels.combine_scan``; ``precise_for_half``: its kernel choice) -> (o
        ``[T, HV, V]``, final state ``[HV, K, V]`` fp32)."""
        if h0 is None:
            h0 = torch.zeros(self.hv, self.dk, self.dv, device=ops.v.device, dtype=torch.float32)
        return combine_scan.gdn_combine_scan(
            ops.q, ops.k, ops.v, ops.g, ops.beta, chain, h0, use_qk_l2norm=True, transition=transition,
            backend=self.backend, tables=tables, precise_for_half=precise_for_half,
        )  # fmt: skip

    def mix_scan_merged(
        self,
        ops: GDNOperands,
        steps: combine_scan.WYSteps,
        row: int,
        h0: torch.Tensor,
        *,
        pair_dtype: torch.dtype,
        transition: bool,
        precise_for_half: bool = DEFAULT_KERNELS.precise_for_half,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``mix_scan`` of N requests' combines at once (CUDA; ``combine_scan.gdn_combine_scan_merged``):
        ``ops`` of their packed active rows, ``steps`` their merged plan, ``row`` this layer's row of
        its pointer tables, h0 ``[N, HV, K, V]`` -> (o ``[T, HV, V]``, final states ``[N, HV, K, V]`` fp32)."""
        return combine_scan.gdn_combine_scan_merged(
            ops.q, ops.k, ops.v, ops.g, ops.beta, steps, row, h0, pair_dtype=pair_dtype, transition=transition,
            precise_for_half=precise_for_half,
        )  # fmt: skip

    def pair_identity(self, like: torch.Tensor) -> torch.Tensor:
        """The transition of an empty span ``[HV, K, K]`` (what ``addition`` puts in place of T)."""
        return torch.eye(self.dk, device=like.device, dtype=torch.float32).expand(self.hv, self.dk, self.dk)

    def compose(self, h0: torch.Tensor, T: torch.Tensor, S: torch.Tensor) -> torch.Tensor:
        """States along a chain: h0 ``[HV, K, V]``, T ``[n, HV, K, K]``, S ``[n, HV, K, V]`` -> ``[n+1, HV, K, V]``."""
        return chain_ops.chain_scan(h0, T, S, backend=self.backend)

    def output(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """o, z ``[T, HV, V]`` -> ``[T, D]``."""
        y = self.norm(o, z)
        return self.out_proj(y.reshape(o.shape[0], self.value_dim))

    # ------------------------------------------------------------------ whole layer
    def forward(
        self,
        x: torch.Tensor,
        cu_seqlens: torch.Tensor | None,
        initial_state: torch.Tensor | None = None,
        conv_state: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x ``[T, D]`` packed -> (y ``[T, D]``, state ``[N, HV, K, V]``, conv ``[N, C, W-1]``)."""
        ops, conv_final = self.operands(x, cu_seqlens, conv_state)
        o, final = self.mix(ops, cu_seqlens, initial_state)
        return self.output(o, ops.z), final, conv_final

    def step(
        self, x: torch.Tensor, state: torch.Tensor, conv_state: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One decode token per sequence: x ``[N, D]``, state ``[N, HV, K, V]``, conv ``[N, C, W-1]``."""
        mixed, z, g, beta = self.inputs(x)
        qkv, conv_new = conv_ops.causal_conv1d_step(mixed, conv_state, self.conv_weight(), None, activation="silu")
        q, k, v = self.split(qkv)
        o, new_state = gdn_ops.gated_delta_rule_step(q, k, v, g, beta, state, use_qk_l2norm=True, backend=self.backend)
        return self.output(o, z), new_state, conv_new

    def decode_slots(
        self, inputs: tuple[torch.Tensor, ...], conv_pool: torch.Tensor, rec_pool: torch.Tensor, slots: torch.Tensor
    ) -> torch.Tensor:
        """Decode rows against their pool slots (conv and recurrent states updated in place) -> o ``[N, HV, V]``."""
        mixed, _, g, beta = inputs
        qkv = conv_decode_slots(mixed, conv_pool, slots, self.conv_weight(), None, backend=self.backend)
        q, k, v = self.split(qkv)
        return gdn_decode_slots(q, k, v, g, beta, rec_pool, slots, backend=self.backend)
