"""The teacher: an all-attention Llama model (SmolLM2 GGUF from the catalog, a local Llama GGUF /
HF folder, or the built-in tiny Llama), its tokenizer and a reference to its weights that a
distilled checkpoint can store instead of the weights themselves (``base`` in ``delta.py``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hypic_agent.config import Settings
from hypic_agent.errors import ModelConfigError, WeightsError
from hypic_agent.runtime.models.hybrid import HybridForCausalLM
from hypic_agent.runtime.models.registry import build_model

_SHA_MEMO: dict[tuple[str, int, int], str] = {}


def file_sha256(path: Path) -> str:
    """sha256 of a file (memoized per path, size and mtime within the process)."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _SHA_MEMO:
        h = hashlib.sha256()
        with path.open("rb") as f:
            while block := f.read(8 << 20):
                h.update(block)
        _SHA_MEMO[key] = h.hexdigest()
    return _SHA_MEMO[key]


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


def load_base(base: dict[str, Any], settings: Settings | None = None) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(HF config, fp32 tensors) of the weights a base reference names (checks sha256)."""
    from hypic_agent.runtime.models.catalog import resolve_model
    from hypic_agent.runtime.models.loading import load_checkpoint

    if "tiny" in base:
        from hypic_agent.runtime.models.testing.tiny import random_state_dict, tiny_config

        raw = tiny_config(base["tiny"])
        return raw, random_state_dict(raw, int(base.get("seed", 0)))
    settings = settings or Settings()
    if "catalog" in base:
        src = resolve_model(base["catalog"], settings)
        path = src.path
    else:
        path = Path(base["path"]).expanduser()
    assert path is not None
    if path.is_file():
        want = base.get("sha256")
        if want and file_sha256(path) != want:
            raise WeightsError(
                f"base weights {path} have sha256 {file_sha256(path)}, but the distilled model was trained on "
                f"{want}; put the right file there (`hypic-agent models fetch {base.get('catalog', '')}`)"
            )
        from hypic_agent.runtime.models.gguf_loader import load_gguf

        _, raw, tensors = load_gguf(path, dtype=torch.float32)
        return raw, tensors
    _, raw, tensors = load_checkpoint(path, dtype=torch.float32)
    return raw, tensors


def load_teacher(name: str, settings: Settings | None = None, *, seed: int = 0) -> Teacher:
    """``tiny`` / ``tiny:llama``, a catalog name, a Llama ``.gguf`` file or a Llama HF folder."""
    from hypic_agent.runtime.models.catalog import CATALOG, resolve_model
    from hypic_agent.runtime.models.tokenizer import load_tokenizer, tiny_tokenizer

    settings = settings or Settings()
    if name in ("tiny", "tiny:llama"):
        base: dict[str, Any] = {"tiny": "llama", "seed": seed}
        raw, tensors = load_base(base, settings)
        return Teacher(raw, tensors, tiny_tokenizer(), base)
    src = resolve_model(name, settings)
    assert src.path is not None
    if src.kind == "gguf":
        base = {"path": str(src.path.resolve()), "sha256": file_sha256(src.path), "size": src.path.stat().st_size}
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
