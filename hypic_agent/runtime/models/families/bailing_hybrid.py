"""Ling 3 (transformers' ``bailing_hybrid``): Kimi Linear's layout (``kimi_linear.py``) with full-rank KDA
gates (the forget gate bounded by ``kda_lower_bound`` when ``kda_safe_gate``), MLA *with* interleaved
RoPE on the ``qk_rope_head_dim`` part and a per-head sigmoid output gate; every ``layer_group_size``-th
layer is attention. Not Ring-linear (``bailing_moe_linear.py``: Lightning with RoPE inside).

Checkpoint names: the hub layout (``word_embeddings``, ``attention.*`` with ``dense`` for every layer,
``expert_bias``) -> transformers' module names, then Kimi Linear's. No GGUF: use the HF folder.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from hypic_agent.errors import ModelConfigError
from hypic_agent.runtime.models.config import HybridConfig
from hypic_agent.runtime.models.families.common import Family, Tensors
from hypic_agent.runtime.models.families.kimi_linear import kimi_linear, kimi_names


def bailing_hybrid(raw: dict[str, Any], model_type: str) -> HybridConfig:
    """Kimi Linear's normalizer on the config with Ling's defaults, then Ling's own fields (module doc)."""
    n = int(raw["num_hidden_layers"])
    group = int(raw.get("layer_group_size", 6))
    heads = int(raw.get("num_attention_heads", 32))
    types = raw.get("layer_types") or [
        "full_attention" if (i + 1) % group == 0 else "linear_attention" for i in range(n)
    ]
    kimi = {
        "first_k_dense_replace": 2,
        **raw,
        "layer_types": types,
        "linear_attn_config": {
            "num_heads": heads,
            "head_dim": int(raw.get("linear_head_dim") or raw.get("head_dim") or 128),
            "short_conv_kernel_size": int(raw.get("short_conv_kernel_size", 4)),
        },
    }
    cfg = kimi_linear(kimi, model_type)
    assert cfg.mla is not None
    theta = float((raw.get("rope_parameters") or {}).get("rope_theta", raw.get("rope_theta", 6_000_000.0)))
    rope_type = (raw.get("rope_parameters") or {}).get("rope_type", "default")
    if rope_type not in ("default", None):
        raise ModelConfigError(f"rope_type {rope_type!r} is not supported yet (only 'default')")
    safe = bool(raw.get("kda_safe_gate", True))
    return replace(
        cfg,
        family="bailing_hybrid",
        max_position_embeddings=int(raw.get("max_position_embeddings", raw.get("model_max_length", 262144))),
        rotary_dim=cfg.mla.qk_rope_head_dim,
        rope_theta=theta,
        mla=replace(cfg.mla, head_gate=True),
        kda_variant="ling",
        kda_lower_bound=float(raw.get("kda_lower_bound", -5.0)) if safe else None,
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
    )


_ATTENTION = re.compile(r"^model\.layers\.(\d+)\.attention\.(.+)$")


def ling_names(cfg: HybridConfig, tensors: Tensors) -> Tensors:
    """Ling 3 (``bailing_hybrid``): the hub layout (what transformers' ``save_pretrained`` writes:
    ``word_embeddings``, ``attention.*`` with ``dense`` for every layer, ``expert_bias``) -> transformers'
    module names, then Kimi Linear's renames (``kimi_linear.kimi_names``: gate tensors under ``forget_gate``, the q/k/v
    convs stacked)."""
    renamed: Tensors = {}
    for k, v in tensors.items():
        k = k.replace("model.word_embeddings.", "model.embed_tokens.")
        k = k.replace(".mlp.gate.expert_bias", ".mlp.gate.e_score_correction_bias")
        m = _ATTENTION.match(k)
        if m is not None:
            leaf = "o_proj." + m[2][len("dense.") :] if m[2].startswith("dense.") else m[2]
            k = f"model.layers.{m[1]}.self_attn.{leaf}"
        renamed[k] = v
    return kimi_names(cfg, renamed)


FAMILY = Family(name="bailing_hybrid", model_types=("bailing_hybrid",), normalize=bailing_hybrid, names=ling_names)
