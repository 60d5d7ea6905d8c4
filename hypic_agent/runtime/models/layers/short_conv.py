"""LFM2's gated short-convolution token mixer.

Per token: ``in_proj`` -> B, C, x ``[D]`` each; ``B * x`` -> causal depthwise conv (kernel
W = ``conv_L_cache``, no activation) -> ``C *`` -> ``out_proj``.

There is no recurrent state: the conv tail (the last W-1 inputs ``B * x``) is the whole state. So
a cached segment needs only its tail, it has no transition pair (its ``T`` / ``S`` are empty), and
a seam window of at least W-1 tokens makes a reused segment's layer exact: every body token's
conv window then lies inside its own segment.

The stages follow the linear-mixer protocol (``linear_mixer.LinearMixer``); the recurrent state
``[0, 0, 0]`` and the empty pairs keep the pool's and the entries' layout common to every kind.
"""

from __future__ import annotations

import torch
from torch import nn

from hypic_agent.kernels import conv as conv_ops
from hypic_agent.kernels.conv_decode import conv_decode_slots
from hypic_agent.kernels.gdn_pairs import PairSink, SeamSplit
from hypic_agent.runtime.models.config import HybridConfig


class ShortConv(nn.Module):
    kind = "short_conv"

    def __init__(self, cfg: HybridConfig) -> None:
        super().__init__()
        d = cfg.hidden_size
        self.hv, self.dk, self.dv = cfg.linear_state_shape  # (0, 0, 0)
        self.conv_dim = d
        self.kernel = cfg.linear_conv_kernel_dim
        self.backend = "auto"
        self.in_proj = nn.Linear(d, 3 * d, bias=cfg.linear_proj_bias)
        self.conv = nn.Conv1d(d, d, self.kernel, groups=d, bias=cfg.linear_conv_bias, padding=self.kernel - 1)
        self.out_proj = nn.Linear(d, d, bias=cfg.linear_out_bias)

    def conv_weight(self) -> torch.Tensor:
        """``[D, W]``"""
        return self.conv.weight.squeeze(1)

    def _empty(self, n: int, like: torch.Tensor) -> torch.Tensor:
        """``[n, 0, 0, 0]``: the (absent) recurrent states."""
        return like.new_zeros(n, 0, 0, 0, dtype=torch.float32)

    def inputs(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x ``[T, D]`` -> (``B * x`` ``[T, D]`` before the conv, C ``[T, D]``)."""
        b, c, xx = self.in_proj(x).chunk(3, dim=-1)
        return b * xx, c

    def convolve(
        self, bx: torch.Tensor, c: torch.Tensor, cu_seqlens: torch.Tensor | None, conv_state: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (conv output ``[T, D]``, final conv state ``[N, D, W-1]``)."""
        return conv_ops.causal_conv1d(
            bx, self.conv_weight(), self.conv.bias, cu_seqlens=cu_seqlens, initial_state=conv_state,
            activation=None, backend=self.backend,
        )  # fmt: skip

    def mix(
        self, ops: torch.Tensor, cu_seqlens: torch.Tensor | None, initial_state: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Nothing recurrent: (the conv output, empty final states ``[N, 0, 0, 0]``)."""
        n = 1 if cu_seqlens is None else cu_seqlens.numel() - 1
        return ops, self._empty(n, ops)

    def mix_into_pairs(
        self, ops: torch.Tensor, cu_seqlens: torch.Tensor, split: SeamSplit, sink: PairSink
    ) -> torch.Tensor:
        """No pairs to write (the entries keep only the conv tail)."""
        return ops

    def mix_after_pairs(
        self, ops: torch.Tensor, cu_seqlens: torch.Tensor, enter: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.mix(ops, cu_seqlens, None)

    def pair_identity(self, like: torch.Tensor) -> torch.Tensor:
        return like.new_zeros(0, dtype=torch.float32)

    def compose(self, h0: torch.Tensor, T: torch.Tensor, S: torch.Tensor) -> torch.Tensor:
        return h0.float().expand(T.shape[0] + 1, *h0.shape)

    def output(self, o: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """conv output, C ``[T, D]`` -> ``[T, D]``."""
        return self.out_proj(c * o)

    def step(
        self, x: torch.Tensor, state: torch.Tensor, conv_state: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One token per sequence: x ``[N, D]``, state ``[N, 0, 0, 0]``, conv ``[N, D, W-1]``."""
        bx, c = self.inputs(x)
        out, conv_new = conv_ops.causal_conv1d_step(bx, conv_state, self.conv_weight(), self.conv.bias, activation=None)
        return self.output(out, c), state, conv_new

    def decode_slots(
        self, inputs: tuple[torch.Tensor, ...], conv_pool: torch.Tensor, rec_pool: torch.Tensor, slots: torch.Tensor
    ) -> torch.Tensor:
        """Decode rows against their pool slots' conv tails (updated in place) -> conv output ``[N, D]``."""
        return conv_decode_slots(
            inputs[0], conv_pool, slots, self.conv_weight(), self.conv.bias, activation=None, backend=self.backend
        )
