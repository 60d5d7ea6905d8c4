"""A real model's shape with seeded random weights, drawn on the device it runs on.

``random:<config.json>`` (``loading/catalog.resolve_model``) serves a checkpoint's architecture at its full
size without its weights: for load, memory and speed measurements where no weights can be fetched
(the GPU machines reach no hub) and for scatter workers, which each draw the same weights from the
same seed on their own device instead of receiving them. The answers are noise.

Values: ``A_log`` uniform in log space over [0.01, 16] (decays of every speed), ``dt_bias`` and the
linear layers' output-norm weights 1, other norm weights 1 (0 where norms are zero-centred), conv
weights N(0, 0.5), everything else N(0, 0.02): activations stay in range through deep stacks.
Drawn with the global RNG of the device after ``torch.manual_seed(seed)``, so two processes on the
same kind of device get the same tensors; CPU and CUDA draw different ones (the fingerprint says
which device drew them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from hypic_agent.errors import ModelNotAvailableError
from hypic_agent.runtime.models.hybrid import HybridForCausalLM, build_model
from hypic_agent.runtime.models.loading.fingerprint import model_fingerprint

INIT_TAG = "hypic-random-init-v1"  # bump when the draws below change


@torch.no_grad()
def fill_random_(model: HybridForCausalLM, seed: int) -> HybridForCausalLM:
    """Overwrite every parameter of ``model`` in place with the seeded draws above; returns it."""
    torch.manual_seed(seed)
    zero_centered = model.config.norm_zero_centered
    for name, p in model.named_parameters():
        if name.endswith("A_log"):
            p.copy_(torch.empty_like(p, dtype=torch.float32).uniform_(0.01, 16).log())
        elif name.endswith("dt_bias") or name.endswith("linear_attn.norm.weight"):
            p.fill_(1.0)
        elif name.endswith("norm.weight"):
            p.fill_(0.0 if zero_centered else 1.0)
        elif name.endswith("conv1d.weight"):
            p.normal_(0, 0.5)
        else:
            p.normal_(0, 0.02)
    return model


def read_random_config(path: Path) -> dict[str, Any]:
    """The transformers ``config.json`` behind a ``random:`` spec (``ModelNotAvailableError`` if unreadable)."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ModelNotAvailableError(
            f"random:{path}: cannot read a transformers config.json there ({e})", param="model"
        ) from e
    if not isinstance(raw, dict) or "model_type" not in raw:
        raise ModelNotAvailableError(f"random:{path}: not a transformers config.json (no model_type)", param="model")
    return raw


def random_model(
    raw: dict[str, Any], *, seed: int, dtype: torch.dtype, device: torch.device
) -> tuple[HybridForCausalLM, str]:
    """Build ``raw``'s model on ``device`` in ``dtype`` with the seeded draws -> (model, fingerprint)."""
    model = fill_random_(build_model(raw, dtype=dtype, device=device), seed)
    return model, model_fingerprint(raw, dtype=dtype, seed=seed, init=f"{INIT_TAG}-{device.type}")
