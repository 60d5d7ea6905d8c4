"""Llama (``llama``): attention only (GQA, RoPE, no output gate or q/k norms), plain ``y * w`` norms,
a SwiGLU MLP; the distillation teacher (SmolLM2). Checkpoints use our tensor names.

GGUF ``llama``: metadata through transformers' GGUF table (``GGUF_CONFIG_MAPPING``) and its tensor
processor (the converter's Q/K row permutation undone), see ``loading/gguf.py``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypic_agent.runtime.models.config import HybridConfig, LayerKind
from hypic_agent.runtime.models.families.common import Family, gqa_heads, hybrid_config, rope_of
from hypic_agent.runtime.models.loading.gguf_meta import GGUFFamily


def llama(raw: dict[str, Any], model_type: str) -> HybridConfig:
    n = int(raw["num_hidden_layers"])
    heads = gqa_heads(raw)
    kinds: tuple[LayerKind, ...] = tuple("attention" for _ in range(n))
    base = hybrid_config(
        raw, model_type, "llama", kinds, heads=heads, rope=rope_of(raw, heads[2]), eps=1e-5, max_positions=2048
    )
    return replace(base, intermediate_size=int(raw["intermediate_size"]))


FAMILY = Family(
    name="llama",
    model_types=("llama",),
    normalize=llama,
    shapes_from_model=False,
    gguf=(GGUFFamily("llama", "llama", "LLAMA"),),
)
