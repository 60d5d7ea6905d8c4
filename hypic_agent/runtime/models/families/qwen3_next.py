"""Qwen3-Next (``qwen3_next``): Qwen3.5's layout (``qwen3_5.py``: Gated DeltaNet around gated attention,
zero-centred norms, MoE with a gated shared expert) with the checkpoint's GDN input projections fused
per key head: ``in_proj_qkvz`` (``[q, k, v, z]``) and ``in_proj_ba`` (``HybridConfig.linear_fused_qkvz``).

GGUF ``qwen3next``: the converter splits ``in_proj_qkvz`` into ``attn_qkv`` and ``attn_gate``, put back
per key head (``qwen3_5.qwen_join``); the ``1 + w`` norms as for Qwen3.5, no value-head reorder.
"""

from __future__ import annotations

from typing import Any

from hypic_agent.runtime.models.config import HybridConfig
from hypic_agent.runtime.models.families.common import Family
from hypic_agent.runtime.models.families.qwen3_5 import (
    gguf_config,
    qwen_fused,
    qwen_hub,
    qwen_hybrid,
    qwen_join,
    zero_centred,
)
from hypic_agent.runtime.models.loading.gguf_meta import GGUFFamily, GGUFMeta


def qwen3_next(raw: dict[str, Any], model_type: str) -> HybridConfig:
    return qwen_hybrid(raw, model_type, "qwen3_next", fused_qkvz=True)


def qwen3_next_config(meta: GGUFMeta) -> dict[str, Any]:
    return gguf_config(meta, "qwen3_next")


_QWEN3NEXT = GGUFFamily(
    "qwen3next", "qwen3_next", "QWEN3NEXT", config=qwen3_next_config, hub=qwen_hub, fused=qwen_fused,
    values=zero_centred, join=qwen_join,
)  # fmt: skip

FAMILY = Family(
    name="qwen3_next", model_types=("qwen3_next",), normalize=qwen3_next, shapes_from_model=False, gguf=(_QWEN3NEXT,)
)
