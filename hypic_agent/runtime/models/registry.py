"""Registry of model families keyed by HF ``model_type``.

Every family builds a ``HybridForCausalLM`` from a ``HybridConfig``; a new architecture (e.g.
``kimi_linear``: KDA + MLA) adds its normalizer in ``config.py`` and its builder here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hypic_agent.errors import ModelConfigError
from hypic_agent.runtime.models.config import FAMILIES, HybridConfig
from hypic_agent.runtime.models.hybrid import HybridForCausalLM

Builder = Callable[[HybridConfig], HybridForCausalLM]

BUILDERS: dict[str, Builder] = {
    "qwen3_5": HybridForCausalLM,
    "qwen3_next": HybridForCausalLM,
    "llama": HybridForCausalLM,
    "lfm2": HybridForCausalLM,
    "granitemoehybrid": HybridForCausalLM,
    "nemotron_h": HybridForCausalLM,
    "minimax": HybridForCausalLM,
    "kimi_linear": HybridForCausalLM,
    "bailing_moe_linear": HybridForCausalLM,
    "bailing_hybrid": HybridForCausalLM,
    "falcon_h1": HybridForCausalLM,
}


def supported_model_types() -> list[str]:
    return sorted(FAMILIES)


def build_model(
    cfg: HybridConfig | dict[str, Any],
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> HybridForCausalLM:
    """Build an (uninitialized-weights) model for ``cfg`` on ``device`` in ``dtype``."""
    if isinstance(cfg, dict):
        cfg = HybridConfig.from_hf(cfg)
    builder = BUILDERS.get(cfg.family)
    if builder is None:
        raise ModelConfigError(f"no builder registered for family {cfg.family!r}")
    # parameters are created in ``dtype`` (a 48B model would not fit a GPU in fp32 before the cast)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype if dtype.is_floating_point else default)
    try:
        with torch.device(device):
            model = builder(cfg)
    finally:
        torch.set_default_dtype(default)
    return model.to(dtype=dtype).eval()
