"""The hybrid decoder stack: embeddings -> N x (norm, mixer, norm, MLP/MoE) -> norm -> lm_head.

Module names mirror transformers' ``*ForCausalLM`` text models, so ``state_dict()`` keys are the
checkpoint keys (see ``loading/safetensors.py``) and transformers' state dicts load as they are. The
layers are in ``layers/`` (``decoder.DecoderLayer``; ``parallel_layer`` for Falcon-H1's halves).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hypic_agent.errors import ModelConfigError, WeightsError
from hypic_agent.kernels.config import DEFAULT_KERNELS, KernelConfig
from hypic_agent.runtime.models.config import HybridConfig
from hypic_agent.runtime.models.families import FAMILIES, normalize_config, to_contract
from hypic_agent.runtime.models.layers.decay_mixer import DecayMixer
from hypic_agent.runtime.models.layers.decoder import DecoderLayer
from hypic_agent.runtime.models.layers.fused_inputs import FusedInputs, unfuse
from hypic_agent.runtime.models.layers.kda_mixer import KimiDeltaAttention
from hypic_agent.runtime.models.layers.mlp import Experts
from hypic_agent.runtime.models.layers.norms import GatedRMSNorm, RMSNorm
from hypic_agent.runtime.models.layers.parallel_layer import parallel_half


def build_layer(cfg: HybridConfig, idx: int) -> DecoderLayer:
    """Our layer ``idx``: a ``DecoderLayer``, or half of a Falcon-H1 layer (``parallel_layer``)."""
    if cfg.parallel is not None:
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
        """Copy tensors named as in ``state_dict()`` or as transformers names them (``families.to_contract``); tied
        lm_head may be absent."""
        tensors = to_contract(self.config, tensors)
        expected = self.state_dict()
        missing = [
            k for k in expected if k not in tensors and not (k == "lm_head.weight" and self.config.tie_word_embeddings)
        ]
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


def build_model(
    cfg: HybridConfig | dict[str, Any],
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> HybridForCausalLM:
    """Build an (uninitialized-weights) model for ``cfg`` (a config.json dict: normalized first) on
    ``device`` in ``dtype``; every family (``families.FAMILIES``) is a ``HybridForCausalLM``."""
    if isinstance(cfg, dict):
        cfg = normalize_config(cfg)
    if cfg.family not in FAMILIES:
        raise ModelConfigError(f"no builder registered for family {cfg.family!r}")
    # parameters are created in ``dtype`` (a 48B model would not fit a GPU in fp32 before the cast)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype if dtype.is_floating_point else default)
    try:
        with torch.device(device):
            model = HybridForCausalLM(cfg)
    finally:
        torch.set_default_dtype(default)
    return model.to(dtype=dtype).eval()
