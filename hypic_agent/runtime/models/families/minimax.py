"""MiniMax (``minimax``: Text-01 / M1): Lightning attention layers (``lightning``: decay-only with a fixed
decay per head) and RoPE attention, MoE without a shared expert, a post-norm residual with per-kind
(alpha, beta) factors.

Checkpoint names: the Lightning layers' ``self_attn.*`` -> ``linear_attn.*`` (their decay buffers are
recomputed, not loaded); hub checkpoints' Mixtral-style experts under ``block_sparse_moe``
(``common.mixtral_expert_name``). No GGUF: use the HF folder.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from hypic_agent.errors import ModelConfigError
from hypic_agent.runtime.models.config import HybridConfig
from hypic_agent.runtime.models.families.common import (
    Family,
    Tensors,
    gqa_heads,
    hybrid_config,
    layer_kinds,
    mixtral_expert_name,
    rope_of,
)


def minimax(raw: dict[str, Any], model_type: str) -> HybridConfig:
    """MiniMax (Text-01 / M1): Lightning and RoPE attention layers, MoE without a shared expert,
    the residual carrying normed states with per-kind (alpha, beta) factors."""
    n = int(raw["num_hidden_layers"])
    types = raw.get("layer_types") or ["full_attention" if (i + 1) % 2 else "linear_attention" for i in range(n)]
    if raw.get("sliding_window"):
        raise ModelConfigError("MiniMax with sliding_window attention is not supported yet")
    heads, kv, head_dim = gqa_heads(raw, kv_default=True)
    theta, _ = rope_of({"rope_theta": 1000000.0, **raw, "partial_rotary_factor": 1.0}, head_dim)

    def ab(prefix: str) -> tuple[float, float]:
        return float(raw.get(f"{prefix}_alpha_factor", 1)), float(raw.get(f"{prefix}_beta_factor", 1))

    kinds = layer_kinds(list(types), ("linear_attention",), ("full_attention", "attention"))
    base = hybrid_config(
        raw, model_type, "minimax", kinds, heads=(heads, kv, head_dim),
        rope=(theta, head_dim),  # transformers rotates the whole head
        eps=1e-5, max_positions=131072,
    )  # fmt: skip
    return replace(
        base,
        attention_bias=False,
        linear_kind="lightning",
        linear_num_key_heads=heads,
        linear_num_value_heads=heads,
        linear_key_head_dim=head_dim,
        linear_value_head_dim=head_dim,
        linear_conv_kernel_dim=1,
        num_experts=int(raw.get("num_local_experts", 8)),
        num_experts_per_tok=int(raw.get("num_experts_per_tok", 2)),
        moe_intermediate_size=int(raw["intermediate_size"]),
        shared_expert_intermediate_size=0,
        norm_topk_prob=True,
        moe_layers=tuple(True for _ in range(n)),
        postnorm_residual=True,
        linear_residual=ab("linear_attn"),
        attention_residual=ab("full_attn"),
        mlp_residual=ab("mlp"),
    )


_SELF_ATTN = re.compile(r"^model\.layers\.(\d+)\.self_attn\.(.+)$")
_BUFFERS = ("slope_rate", "query_decay", "key_decay", "diagonal_decay")  # recomputed, not loaded


def minimax_names(cfg: HybridConfig, tensors: Tensors) -> Tensors:
    """Lightning layers' ``self_attn.*`` -> ``linear_attn.*``; their decay buffers dropped."""
    out: Tensors = {}
    for k, v in tensors.items():
        m = _SELF_ATTN.match(k)
        if m is not None and cfg.layer_types[int(m[1])] == "linear":
            if m[2] in _BUFFERS:
                continue
            k = f"model.layers.{m[1]}.linear_attn.{m[2]}"
        out[k] = v
    return out


FAMILY = Family(
    name="minimax", model_types=("minimax",), normalize=minimax, names=minimax_names, expert_names=mixtral_expert_name
)
