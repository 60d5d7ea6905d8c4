"""Tiny configs of the Bailing families: Ring-linear (``tiny:bailing_moe_linear``: config and seeded
weights drawn on our own module) and Ling 3 (``tiny:bailing_hybrid``: a transformers config).

Ring-linear: transformers has no such model (its ``bailing_hybrid`` is Ling 3: KDA + MLA, a different
architecture), so there is no ``build_hf_model`` oracle for this family: the weights are drawn on our
module tree (``hybrid.build_model``) in our naming, the way ``tiny.random_state_dict`` re-draws
transformers' init: linear weights ``N(0, initializer_range)``, norms ``1 + N(0, 0.1)``, the expert bias
``N(0, 0.1)``. The layer math is checked against a token-by-token reference in the tests instead.
"""

from __future__ import annotations

from typing import Any

import torch

from hypic_agent.runtime.models.families import normalize_config
from hypic_agent.runtime.models.hybrid import build_model

# 4 layers: Lightning-with-RoPE, Lightning-with-RoPE, GQA attention, Lightning-with-RoPE
# (layer_group_size 3); 4 heads x 16 with RoPE on half of each head, 2 output-norm groups, q/k norms,
# a dense first layer then a sigmoid-routed MoE (4 experts, 2 groups) with a shared expert
RING_TINY: dict[str, Any] = {
    "model_type": "bailing_moe_linear",
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "layer_group_size": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "partial_rotary_factor": 0.5,
    "rope_theta": 10000.0,
    "use_qk_norm": True,
    "group_norm_size": 2,
    "linear_silu": False,
    "use_bias": False,
    "use_qkv_bias": False,
    "intermediate_size": 128,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "num_shared_experts": 1,
    "moe_intermediate_size": 32,
    "first_k_dense_replace": 1,
    "score_function": "sigmoid",
    "moe_router_enable_expert_bias": True,
    "n_group": 2,
    "topk_group": 1,
    "routed_scaling_factor": 2.0,
    "norm_topk_prob": True,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 4096,
    "initializer_range": 0.05,
    "tie_word_embeddings": False,
}


# Ling 3 (transformers' ``bailing_hybrid``; merged over ``tiny._COMMON`` there): Kimi Linear's KDA with
# full-rank gates (bounded forget gate), MLA with interleaved RoPE on 8 of 24 key dims and a per-head
# output gate, every third layer attention, a dense first layer then a grouped sigmoid-routed MoE
LING_TINY: dict[str, Any] = {
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 16,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "n_group": 2,
    "topk_group": 1,
    "routed_scaling_factor": 2.0,
    "first_k_dense_replace": 1,
    "kv_lora_rank": 32,
    "q_lora_rank": None,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "layer_group_size": 3,
    "short_conv_kernel_size": 4,
    "kda_safe_gate": True,
    "kda_lower_bound": -5.0,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "num_mtp_layers": 0,
    "tie_word_embeddings": False,
}


def own_state_dict(hf_config: dict[str, Any], seed: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Seeded weights for a family transformers lacks, drawn on our module (naming contract)."""
    cfg = normalize_config(hf_config)
    names = build_model(cfg, device="meta").state_dict()
    gen = torch.Generator().manual_seed(seed)
    std = float(hf_config.get("initializer_range", 0.02))
    out: dict[str, torch.Tensor] = {}
    for name, meta in names.items():
        shape = tuple(meta.shape)
        if name.endswith("norm.weight"):
            t = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        elif name.endswith(("e_score_correction_bias", ".bias")):
            t = 0.1 * torch.randn(shape, generator=gen)
        else:
            t = std * torch.randn(shape, generator=gen)
        out[name] = t.to(dtype).contiguous()
    if cfg.tie_word_embeddings:
        out.pop("lm_head.weight", None)
    return out
