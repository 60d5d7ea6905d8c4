"""The families we serve, one module each (``families/<family>.py``, named as ``HybridConfig.family``):
how its config.json becomes a ``HybridConfig`` (and so which mixer its linear layers run: the config's
``linear_kind``), how its checkpoints' tensor names become ours, and which GGUF architectures load as
it, ending in its ``Family`` record (``common.Family``). Here: the table of them and the lookups the
loaders and the model use.

Our modules keep one naming for every family (``model.layers.{i}.linear_attn`` for any linear mixer,
``self_attn.{q,k,v,o}_proj`` / ``q_norm`` / ``k_norm``, ``input_layernorm`` / ``post_attention_layernorm``,
``mlp.{gate,up,down}_proj`` or ``mlp.{gate,experts,shared_expert}``, ``model.norm``): transformers'
names of Qwen3.5 / Qwen3-Next / Llama; ``to_contract`` renames (and where a tensor is fused, splits)
the other families' names into it. Names already in our naming pass through, so it is safe to apply
twice.
"""

from __future__ import annotations

from typing import Any

from hypic_agent.errors import ModelConfigError
from hypic_agent.runtime.models.config import HybridConfig
from hypic_agent.runtime.models.families import (
    bailing_hybrid,
    bailing_moe_linear,
    falcon_h1,
    granitemoehybrid,
    kimi_linear,
    lfm2,
    llama,
    minimax,
    nemotron_h,
    qwen3_5,
    qwen3_next,
)
from hypic_agent.runtime.models.families.common import Family, Tensors
from hypic_agent.runtime.models.loading.gguf_meta import GGUFFamily

FAMILIES: dict[str, Family] = {
    m.FAMILY.name: m.FAMILY
    for m in (
        qwen3_5, qwen3_next, llama, lfm2, granitemoehybrid, nemotron_h, minimax, kimi_linear, bailing_moe_linear,
        bailing_hybrid, falcon_h1,
    )
}  # fmt: skip
"""Family name (``HybridConfig.family``) -> its record."""

MODEL_TYPES: dict[str, str] = {t: f.name for f in FAMILIES.values() for t in f.model_types}
"""config.json ``model_type`` values accepted -> the family that runs them."""

GGUF_FAMILIES: dict[str, GGUFFamily] = {g.arch: g for f in FAMILIES.values() for g in f.gguf}
"""GGUF ``general.architecture`` -> how ``loading.gguf.load_gguf`` reads it."""

SHAPES_FROM_MODEL: frozenset[str] = frozenset(f.name for f in FAMILIES.values() if f.shapes_from_model)
"""Families whose tensor shapes ``loading.shapes.expected_shapes`` reads off the model built on the meta
device (the others: its Qwen / Llama table)."""


def supported_model_types() -> list[str]:
    return sorted(MODEL_TYPES)


def normalize_config(raw: dict[str, Any]) -> HybridConfig:
    """Normalize a Hugging Face config dict (Qwen3.5's wrapper configs with ``text_config`` included)."""
    raw = qwen3_5.text_config(raw)
    model_type = raw.get("model_type")
    if model_type not in MODEL_TYPES:
        raise ModelConfigError(
            f"unknown model_type {model_type!r}; supported: {sorted(MODEL_TYPES)}. "
            "Add a family module under hypic_agent/runtime/models/families/."
        )
    try:
        return FAMILIES[MODEL_TYPES[model_type]].normalize(raw, model_type)
    except KeyError as e:
        raise ModelConfigError(f"config.json for {model_type!r} lacks required field {e.args[0]!r}") from e


def to_contract(cfg: HybridConfig, tensors: Tensors) -> Tensors:
    """transformers' tensor names of ``cfg.family`` -> ours (see module doc)."""
    family = FAMILIES.get(cfg.family)
    if family is None or family.names is None:
        return tensors
    return family.names(cfg, tensors)


def expert_name(cfg: HybridConfig, name: str) -> str:
    """A checkpoint name before per-expert tensors are fused (``loading.safetensors.map_checkpoint_names``):
    the family's hub naming of per-expert tensors (MiniMax, Kimi Linear) -> transformers'."""
    family = FAMILIES.get(cfg.family)
    if family is None or family.expert_names is None:
        return name
    return family.expert_names(name)
