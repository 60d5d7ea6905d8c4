"""One decoder layer: norm -> mixer -> residual -> norm -> MLP / MoE -> residual.

``DecoderLayer`` holds one token mixer (``self_attn`` for attention layers, ``linear_attn`` for
fixed-state layers: the module ``LINEAR_MIXERS`` names for the config's ``linear_kind``) and its
feed-forward half; the stack (``models/hybrid.py``) puts one per layer, or two halves of a parallel
layer (``parallel_layer``: Falcon-H1).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from hypic_agent.runtime.models.config import HybridConfig
from hypic_agent.runtime.models.layers.attention import FullAttention
from hypic_agent.runtime.models.layers.gated_deltanet import GatedDeltaNet
from hypic_agent.runtime.models.layers.kda_mixer import KimiDeltaAttention
from hypic_agent.runtime.models.layers.lightning import LightningAttention
from hypic_agent.runtime.models.layers.linear_mixer import LinearMixer
from hypic_agent.runtime.models.layers.mamba2 import Mamba2Mixer
from hypic_agent.runtime.models.layers.mla import MLAttention
from hypic_agent.runtime.models.layers.mlp import build_mlp
from hypic_agent.runtime.models.layers.norms import RMSNorm
from hypic_agent.runtime.models.layers.ring_linear import RingLinearAttention
from hypic_agent.runtime.models.layers.short_conv import ShortConv

# the module of each linear-layer kind (``HybridConfig.linear_kind``), built from (config, layer index)
LINEAR_MIXERS: dict[str, Callable[[HybridConfig, int], nn.Module]] = {
    "gdn": lambda cfg, _: GatedDeltaNet(cfg),
    "mamba2": lambda cfg, _: Mamba2Mixer(cfg),
    "short_conv": lambda cfg, _: ShortConv(cfg),
    "lightning": LightningAttention,
    "kda": lambda cfg, _: KimiDeltaAttention(cfg),
    "lightning_rope": RingLinearAttention,
}


def _mix(base: torch.Tensor, y: torch.Tensor, alpha: float, beta: float) -> torch.Tensor:
    """``alpha * base + beta * y`` (``base + y`` when both are 1: the usual residual, unchanged)."""
    if alpha == 1.0:
        return base + y if beta == 1.0 else base + y * beta
    return base * alpha + y * beta


class DecoderLayer(nn.Module):
    """norm -> mixer -> residual -> norm -> MLP / MoE -> residual. ``mixer_kind``: ``attention`` or the
    linear kind (``gdn`` | ``kda`` | ``mamba2`` | ``lightning`` | ``lightning_rope`` | ``short_conv``); a linear layer's
    mixer is ``linear_attn`` (any ``LinearMixer``), an attention layer's ``self_attn``."""

    def __init__(self, cfg: HybridConfig, idx: int) -> None:
        super().__init__()
        self.kind = cfg.layer_types[idx]
        self.mixer_kind: str = cfg.linear_kind if self.kind == "linear" else "attention"
        self.linear_attn: LinearMixer | None = None
        self.self_attn: FullAttention | None = None
        if self.kind == "linear":
            self.linear_attn = LINEAR_MIXERS[cfg.linear_kind](cfg, idx)  # type: ignore[assignment]
        else:
            self.self_attn = MLAttention(cfg) if cfg.mla is not None else FullAttention(cfg)
        self.mlp = build_mlp(cfg, idx)  # None: no feed-forward half (Nemotron-H mixer blocks without an MLP block)
        # an RMSNorm but in a parallel layer's attention half (``parallel_layer.CarriedInput``)
        self.input_layernorm: nn.Module = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.norm_zero_centered)
        self.post_attention_layernorm: RMSNorm | None = None
        if self.mlp is not None:
            self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.norm_zero_centered)
        # (alpha, beta) of each half's residual: 1s but Granite's residual_multiplier (beta) and MiniMax's
        # factors; MiniMax's residual is the normed state (``postnorm``)
        rm = cfg.residual_multiplier
        a, b = cfg.linear_residual if self.kind == "linear" else cfg.attention_residual
        self.mixer_ab = (a, b * rm)
        self.ffn_ab = (cfg.mlp_residual[0], cfg.mlp_residual[1] * rm)
        self.postnorm = cfg.postnorm_residual

    def residual(self, h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The mixer half's residual: ``h + y`` (Granite: ``h + y * residual_multiplier``; MiniMax:
        ``alpha * norm(h) + beta * y``)."""
        return _mix(self.input_layernorm(h) if self.postnorm else h, y, *self.mixer_ab)

    def feed_forward(self, h: torch.Tensor) -> torch.Tensor:
        """Residual MLP half of the block: ``h + mlp(norm(h))`` (h itself without one). h ``[T, D]``."""
        if self.mlp is None or self.post_attention_layernorm is None:
            return h
        x = self.post_attention_layernorm(h)
        return _mix(x if self.postnorm else h, self.mlp(x), *self.ffn_ab)

    def mixer_in(self, h: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Token-local start of the mixer: input norm and projections. h ``[T, D]`` -> the linear
        mixer's ``inputs`` (GDN ``(mixed, z, g, beta)``, Mamba2 ``(xBC, z, g, dt)``, short conv
        ``(B*x, C)``) or attention ``(q, k, v[, gate])`` (``FullAttention.qkv``; gate only for gated
        attention)."""
        x = self.input_layernorm(h)
        if self.linear_attn is not None:
            return self.linear_attn.inputs(x)
        assert self.self_attn is not None
        q, k, v, gate = self.self_attn.qkv(x)
        return (q, k, v) if gate is None else (q, k, v, gate)

    def mixer_out(self, h: torch.Tensor, o: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor:
        """Token-local end of the block: mixer output projection, residual, feed-forward half.
        o: a linear mixer's output with extra ``inputs[1:2]`` (GDN ``[T, HV, V]`` with ``(z,)``), or
        attention ``[T, Hq, D]`` with ``(gate,)`` or ``()``."""
        if self.linear_attn is not None:
            y = self.linear_attn.output(o, extra[0])
        else:
            assert self.self_attn is not None
            y = self.self_attn.output(o, extra[0] if extra else None)
        return self.feed_forward(self.residual(h, y))
