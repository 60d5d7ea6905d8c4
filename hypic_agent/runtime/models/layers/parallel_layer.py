"""A layer whose Mamba2 and attention mixers run in parallel (Falcon-H1), served as two layers.

Falcon-H1 layer i: ``x = norm(h)``; ``h' = h + (ssm_out * mamba(x) + attn_out * attn(attn_in * x))``;
``h' + mlp(norm'(h'))``. The runtime's layer loops (prefill, decode, the runner over the state pool,
entry building, combine) handle a layer with one mixer: a fixed-size state (``linear``) or a KV that
grows (``attention``). So checkpoint layer i becomes our layers 2i and 2i+1, each with one mixer and
one kind of state, and every loop, ``RequestState``, ``SegmentEntry`` (a pair + conv tail for 2i, the
K/V for 2i+1) and ``StatePool`` (a slot for 2i, pages for 2i+1) works unchanged:

* 2i, ``ParallelSsmHalf`` (``linear``): the input norm and the Mamba2 branch; it passes on
  ``[h | attn_in * x | ssm_out * mamba(x)]`` (``[T, 3D]``: the residual, the attention branch's input,
  the SSM branch's output);
* 2i+1, ``ParallelAttentionHalf`` (``attention``): attention on the carried input, then
  ``h + (m + attn_out * attn)`` in transformers' order and the MLP half.

Between the two halves the hidden stream is three times as wide; everywhere else it is ``[T, D]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hypic_agent.runtime.models.config import HybridConfig
from hypic_agent.runtime.models.layers.attention import FullAttention
from hypic_agent.runtime.models.layers.decoder import DecoderLayer
from hypic_agent.runtime.models.layers.falcon_mamba import FalconMamba2
from hypic_agent.runtime.models.layers.norms import RMSNorm


class ScaledMLP(nn.Module):
    """Falcon-H1's MLP: ``down(up(x) * silu(gate(x) * g)) * d``. x ``[T, D]``."""

    def __init__(self, hidden: int, intermediate: int, gate_mult: float, down_mult: float) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.gate_mult, self.down_mult = gate_mult, down_mult

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.gate_proj(x)
        y = self.up_proj(x) * F.silu(gate if self.gate_mult == 1.0 else gate * self.gate_mult)
        y = self.down_proj(y)
        return y if self.down_mult == 1.0 else y * self.down_mult


class CarriedInput(nn.Module):
    """The attention half's input 'norm': columns ``D:2D`` of the stream, where the SSM half left the
    normed layer input (times ``attention_in``)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.d = d

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h[..., self.d : 2 * self.d]


def _bare(layer: DecoderLayer, cfg: HybridConfig, idx: int) -> None:
    """The ``DecoderLayer`` fields the loops read, with no modules yet (each half adds its own)."""
    nn.Module.__init__(layer)
    layer.kind = cfg.layer_types[idx]
    layer.mixer_kind = cfg.linear_kind if layer.kind == "linear" else "attention"
    layer.linear_attn = layer.self_attn = layer.mlp = layer.post_attention_layernorm = None
    layer.mixer_ab, layer.ffn_ab, layer.postnorm = (1.0, 1.0), (1.0, 1.0), False


class ParallelSsmHalf(DecoderLayer):
    """Layer 2i: checkpoint layer i's input norm and Mamba2 branch (see module doc)."""

    def __init__(self, cfg: HybridConfig, idx: int) -> None:
        _bare(self, cfg, idx)
        assert cfg.parallel is not None
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, zero_centered=False)
        self.linear_attn = FalconMamba2(cfg)
        self.attention_in = cfg.parallel.attention_in

    def residual(self, h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``[h | attn_in * norm(h) | y]`` ``[T, 3D]`` (y: the SSM branch's output, ``ssm_out`` applied)."""
        x = self.input_layernorm(h)
        return torch.cat([h, x if self.attention_in == 1.0 else x * self.attention_in, y], dim=-1)


class ParallelAttentionHalf(DecoderLayer):
    """Layer 2i+1: checkpoint layer i's attention branch, the residual of both branches, its MLP."""

    def __init__(self, cfg: HybridConfig, idx: int) -> None:
        _bare(self, cfg, idx)
        assert cfg.parallel is not None
        d = self.d = cfg.hidden_size
        self.input_layernorm = CarriedInput(d)
        self.self_attn = FullAttention(cfg)
        self.post_attention_layernorm = RMSNorm(d, cfg.rms_norm_eps, zero_centered=False)
        s = cfg.parallel
        self.mlp = ScaledMLP(d, cfg.intermediate_size, s.mlp_gate, s.mlp_down)
        self.attention_out = s.attention_out

    def residual(self, h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``[T, 3D]`` stream, y the attention output ``[T, D]`` -> ``h + (m + attn_out * y)``."""
        d = self.d
        a = y if self.attention_out == 1.0 else y * self.attention_out
        return h[..., :d] + (h[..., 2 * d :] + a)


def parallel_half(cfg: HybridConfig, idx: int) -> DecoderLayer:
    """Our layer ``idx`` of a parallel-mixer stack: even the SSM half, odd the attention half."""
    return ParallelSsmHalf(cfg, idx) if cfg.layer_types[idx] == "linear" else ParallelAttentionHalf(cfg, idx)
