"""The hybrid decoder stack: embeddings -> N x (norm, mixer, norm, MLP/MoE) -> norm -> lm_head.

Module names mirror transformers' ``*ForCausalLM`` text models, so ``state_dict()`` keys are the
checkpoint keys (see ``loading.py``) and transformers' state dicts load as they are.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from hypic_agent.kernels.config import DEFAULT_KERNELS, KernelConfig
from hypic_agent.runtime.models.attention import FullAttention
from hypic_agent.runtime.models.config import HybridConfig
from hypic_agent.runtime.models.decay_mixer import DecayMixer
from hypic_agent.runtime.models.fused_inputs import FusedInputs, unfuse
from hypic_agent.runtime.models.gated_deltanet import GatedDeltaNet
from hypic_agent.runtime.models.kda_mixer import KimiDeltaAttention
from hypic_agent.runtime.models.lightning import LightningAttention
from hypic_agent.runtime.models.linear_mixer import LinearMixer
from hypic_agent.runtime.models.mamba2 import Mamba2Mixer
from hypic_agent.runtime.models.mla import MLAttention
from hypic_agent.runtime.models.mlp import Experts, build_mlp
from hypic_agent.runtime.models.norms import GatedRMSNorm, RMSNorm
from hypic_agent.runtime.models.ring_linear import RingLinearAttention
from hypic_agent.runtime.models.short_conv import ShortConv

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


def build_layer(cfg: HybridConfig, idx: int) -> DecoderLayer:
    """Our layer ``idx``: a ``DecoderLayer``, or half of a Falcon-H1 layer (``parallel_layer``)."""
    if cfg.parallel is not None:
        from hypic_agent.runtime.models.parallel_layer import parallel_half

        return parallel_half(cfg, idx)
    return DecoderLayer(cfg, idx)


class Backbone(nn.Module):
    def __init__(self, cfg: HybridConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([build_layer(cfg, i) for i in range(cfg.num_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.norm_zero_centered)


class HybridForCausalLM(nn.Module):
    """Weights + per-stage modules. Running the stack over a batch lives in ``runner/layer_loop.py``."""

    def __init__(self, cfg: HybridConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = Backbone(cfg)
        self.embedding_multiplier = cfg.embedding_multiplier  # Granite; 1.0 elsewhere
        self.logits_scaling = cfg.logits_scaling
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.kernels: KernelConfig = DEFAULT_KERNELS  # what ``set_kernels`` last handed down
        self._fused: list[FusedInputs] = []  # ``fuse_projections``

    @property
    def layers(self) -> list[DecoderLayer]:
        return list(self.model.layers)  # type: ignore[arg-type]

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``[T]`` -> ``[T, D]``"""
        h = self.model.embed_tokens(input_ids)
        return h if self.embedding_multiplier == 1.0 else h * self.embedding_multiplier

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm + lm_head: ``[T, D]`` -> ``[T, vocab]`` (fp32)."""
        logits = self.lm_head(self.model.norm(h)).float()
        return logits if self.logits_scaling == 1.0 else logits / self.logits_scaling

    def set_backend(self, backend: str) -> None:
        """Kernel backend for every mixer and norm: ``auto`` | ``torch`` | ``fla``."""
        for layer in self.layers:
            mixer = layer.linear_attn if layer.linear_attn is not None else layer.self_attn
            assert mixer is not None
            mixer.backend = backend
        for m in self.modules():
            if isinstance(m, RMSNorm | GatedRMSNorm):
                m.backend = backend

    def fuse_projections(self) -> None:
        """Run the projections that read one input as one GEMM each (``fused_inputs``): GDN inputs,
        router + shared expert, MLP gate + up. For inference (the engine, the serving benchmarks);
        idempotent; ``.to()`` keeps it (``_apply``)."""
        if self._fused:
            return
        for layer in self.layers:  # a MoE fuses its shared expert's gate and up with its router
            for m in (layer.linear_attn, layer.mlp):
                fuse_inputs = getattr(m, "fuse_inputs", None)
                if callable(fuse_inputs):
                    self._fused.extend(fuse_inputs())

    def _apply(self, fn, recurse=True):  # type: ignore[no-untyped-def]
        """``.to()`` / ``.cuda()`` / ``.half()``: the fused weights' views would not survive the copies,
        so the parts get their own storage first and are fused again afterwards."""
        fused = bool(getattr(self, "_fused", None))
        if fused:
            for f in self._fused:
                unfuse(f)
            for m in self.modules():
                if hasattr(m, "fused_in"):
                    m.fused_in = None
            self._fused = []
        out = super()._apply(fn, recurse)
        if fused:
            self.fuse_projections()
        return out

    def set_kernels(self, kernels: KernelConfig) -> None:
        """Kernel choices for every module that calls a configurable kernel: the MoE experts
        (``moe_triton_*``), the norms (``norm_fla_min_rows``) and the KDA / decay-only mixers
        (``recurrent_scan_max_tokens``). Set before layer graphs are captured: a captured graph
        keeps the path it was captured with."""
        self.kernels = kernels
        for m in self.modules():
            if isinstance(m, RMSNorm | GatedRMSNorm | Experts | KimiDeltaAttention | DecayMixer):
                m.kernels = kernels

    def load_weights(self, tensors: dict[str, torch.Tensor], strict: bool = True) -> None:
        """Copy tensors named as in ``state_dict()`` or as transformers names them (``keymap``); tied
        lm_head may be absent."""
        from hypic_agent.runtime.models.keymap import to_contract

        tensors = to_contract(self.config, tensors)
        expected = self.state_dict()
        missing = [
            k for k in expected if k not in tensors and not (k == "lm_head.weight" and self.config.tie_word_embeddings)
        ]
        from hypic_agent.errors import WeightsError

        if strict and missing:
            raise WeightsError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}")
        with torch.no_grad():
            for name, t in tensors.items():
                if name not in expected:
                    if strict:
                        raise WeightsError(f"unexpected tensor {name!r} in checkpoint")
                    continue
                if tuple(expected[name].shape) != tuple(t.shape):
                    raise WeightsError(
                        f"tensor {name!r} has shape {tuple(t.shape)}, config expects {tuple(expected[name].shape)}"
                    )
                expected[name].copy_(t)
