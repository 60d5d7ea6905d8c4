"""The teacher: an all-attention Llama model (SmolLM2 GGUF from the catalog, a local Llama GGUF /
HF folder, or the built-in tiny Llama), its tokenizer and a reference to its weights that a
distilled checkpoint can store instead of the weights themselves (``base`` in ``delta.py``; the
runtime loads what a reference names: ``runtime/models/loading/weights.load_base``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from hypic_agent.config import Settings
from hypic_agent.errors import ModelConfigError
from hypic_agent.runtime.models.hybrid import HybridForCausalLM, build_model
from hypic_agent.runtime.models.loading.checksums import cached_file_sha256
from hypic_agent.runtime.models.loading.weights import load_base


@dataclass
class Teacher:
    """Teacher weights (naming contract, fp32), HF config dict, tokenizer and base reference."""

    hf_config: dict[str, Any]
    tensors: dict[str, torch.Tensor]
    tokenizer: Any
    base: dict[str, Any]

    def build(self, device: str | torch.device = "cpu") -> HybridForCausalLM:
        """A frozen ``HybridForCausalLM`` of the teacher on ``device`` (fp32 weights)."""
        model = build_model(self.hf_config, device=device)
        model.load_weights({k: v.to(device) for k, v in self.tensors.items()})
        model.requires_grad_(False)
        return model.eval()


def load_teacher(name: str, settings: Settings | None = None, *, seed: int = 0) -> Teacher:
    """``tiny`` / ``tiny:llama``, a catalog name, a Llama ``.gguf`` file or a Llama HF folder."""
    from hypic_agent.runtime.models.loading.catalog import CATALOG, resolve_model
    from hypic_agent.runtime.models.loading.tokenizer import load_tokenizer, tiny_tokenizer

    settings = settings or Settings()
    if name in ("tiny", "tiny:llama"):
        base: dict[str, Any] = {"tiny": "llama", "seed": seed}
        raw, tensors = load_base(base, settings)
        return Teacher(raw, tensors, tiny_tokenizer(), base)
    src = resolve_model(name, settings)
    assert src.path is not None
    if src.kind == "gguf":
        base = {
            "path": str(src.path.resolve()),
            "sha256": cached_file_sha256(src.path),
            "size": src.path.stat().st_size,
        }
        if name in CATALOG:
            base = {"catalog": name, "file": src.path.name, "sha256": CATALOG[name].sha256, "size": CATALOG[name].size}
    elif src.kind == "hf":
        base = {"path": str(src.path.resolve())}
    else:
        raise ModelConfigError(f"teacher {name!r}: use 'tiny', a catalog name, a .gguf file or an HF folder")
    raw, tensors = load_base(base, settings)
    if raw.get("model_type") != "llama":
        raise ModelConfigError(f"teacher {name!r} is {raw.get('model_type')!r}; distillation converts Llama models")
    return Teacher(raw, tensors, load_tokenizer(src), base)
