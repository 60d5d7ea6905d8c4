"""Ring-linear (``bailing_moe_linear``: inclusionAI's Ring-mini/flash-linear-2.0).

Layers: ``(i + 1) % layer_group_size == 0`` is a GQA attention layer (fused ``query_key_value``, per-head
q/k RMSNorm, partial NeoX RoPE), every other one a Lightning linear-attention layer with RoPE inside
(``lightning_rope``: the same heads, head dim, rotary dims and theta as the attention layers, MHA). The
first ``first_k_dense_replace`` layers have a dense MLP, the rest a MoE with a sigmoid router (expert
bias, grouped top-k, ``routed_scaling_factor``) and ungated shared experts. Plain (``y * w``) norms.
Ring-2.5's MLA attention layers (``kv_lora_rank`` in the config) are not supported.

Checkpoint names (hub ``bailing_moe_linear``): ``word_embeddings`` -> ``embed_tokens``; a linear layer's
``attention.*`` -> ``linear_attn.*``; an attention layer's fused ``query_key_value`` split into
``self_attn.{q,k,v}_proj``. No GGUF: use the HF folder.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from hypic_agent.errors import ModelConfigError
from hypic_agent.runtime.models.config import HybridConfig, LayerKind
from hypic_agent.runtime.models.families.common import Family, Tensors, gqa_heads, hybrid_config, rope_of


def bailing_moe_linear(raw: dict[str, Any], model_type: str) -> HybridConfig:
    if raw.get("kv_lora_rank"):
        raise ModelConfigError("Ring-linear with MLA attention layers (Ring-2.5) is not supported yet")
    if str(raw.get("score_function", "sigmoid")) != "sigmoid" or not raw.get("moe_router_enable_expert_bias", True):
        raise ModelConfigError("Ring-linear with a softmax router is not supported yet (sigmoid + expert bias only)")
    n = int(raw["num_hidden_layers"])
    group = int(raw.get("layer_group_size", 4))
    kinds: tuple[LayerKind, ...] = tuple(
        "attention" if group > 0 and (i + 1) % group == 0 else "linear" for i in range(n)
    )
    heads = gqa_heads(raw, kv_default=True)
    head_dim = heads[2]
    k_dense = int(raw.get("first_k_dense_replace", 0))
    n_experts = int(raw.get("num_experts", 0))
    moe_inter = int(raw.get("moe_intermediate_size", 0))
    shared = int(raw.get("moe_shared_expert_intermediate_size") or moe_inter) * int(raw.get("num_shared_experts", 0))
    bias = bool(raw.get("use_bias", False))
    base = hybrid_config(
        raw, model_type, "bailing_moe_linear", kinds, heads=heads,
        rope=rope_of({"rope_theta": 600000.0, **raw}, head_dim), eps=1e-6, max_positions=131072,
    )  # fmt: skip
    return replace(
        base,
        qk_norm=bool(raw.get("use_qk_norm", False)),
        attention_bias=bias or bool(raw.get("use_qkv_bias", False)),
        linear_kind="lightning_rope",
        linear_num_key_heads=heads[0],
        linear_num_value_heads=heads[0],
        linear_key_head_dim=head_dim,
        linear_value_head_dim=head_dim,
        linear_conv_kernel_dim=1,
        linear_proj_bias=bias or bool(raw.get("use_qkv_bias", False)),
        linear_out_bias=bias,
        linear_silu=bool(raw.get("linear_silu", raw.get("use_linear_silu", False))),
        linear_qk_norm=bool(raw.get("use_qk_norm", False)),
        linear_group_norm=int(raw.get("group_norm_size", 1)),
        intermediate_size=int(raw.get("intermediate_size", 0)),
        num_experts=n_experts,
        num_experts_per_tok=int(raw.get("num_experts_per_tok", 0)),
        moe_intermediate_size=moe_inter,
        shared_expert_intermediate_size=shared,
        shared_expert_gate=False,
        norm_topk_prob=bool(raw.get("norm_topk_prob", True)),
        router="sigmoid",
        routed_scaling_factor=float(raw.get("routed_scaling_factor", 1.0)),
        router_groups=(int(raw.get("n_group") or 1), int(raw.get("topk_group") or 1)),
        moe_layers=tuple(n_experts > 1 and i >= k_dense for i in range(n)),
    )


_ATTENTION = re.compile(r"^model\.layers\.(\d+)\.attention\.(.+)$")
_RING_ATTN = {"query_layernorm": "q_norm", "key_layernorm": "k_norm", "dense": "o_proj"}


def ring_names(cfg: HybridConfig, tensors: Tensors) -> Tensors:
    """Ring-linear (hub ``bailing_moe_linear``): ``word_embeddings`` -> ``embed_tokens``; a linear
    layer's ``attention.*`` -> ``linear_attn.*`` (same leaf names); an attention layer's fused
    ``query_key_value`` split into ``self_attn.{q,k,v}_proj``, its ``query/key_layernorm`` / ``dense`` ->
    ``q_norm`` / ``k_norm`` / ``o_proj``; ``mlp.gate.expert_bias`` -> ``e_score_correction_bias``,
    ``mlp.shared_experts`` -> ``mlp.shared_expert``."""
    out: Tensors = {}
    q_rows = cfg.num_attention_heads * cfg.head_dim
    kv_rows = cfg.num_key_value_heads * cfg.head_dim
    for k, v in tensors.items():
        k = k.replace("model.word_embeddings.", "model.embed_tokens.")
        k = k.replace(".mlp.gate.expert_bias", ".mlp.gate.e_score_correction_bias")
        k = k.replace(".mlp.shared_experts.", ".mlp.shared_expert.")
        m = _ATTENTION.match(k)
        if m is None:
            out[k] = v
            continue
        pre, leaf = f"model.layers.{m[1]}.", m[2]
        if cfg.layer_types[int(m[1])] == "linear":
            out[pre + "linear_attn." + leaf] = v
        elif leaf.startswith("query_key_value."):
            q, kk, vv = v.split([q_rows, kv_rows, kv_rows])
            for name, part in (("q_proj", q), ("k_proj", kk), ("v_proj", vv)):
                out[pre + f"self_attn.{name}." + leaf.split(".", 1)[1]] = part
        else:
            head, rest = leaf.split(".", 1)
            out[pre + f"self_attn.{_RING_ATTN.get(head, head)}.{rest}"] = v
    return out


FAMILY = Family(
    name="bailing_moe_linear", model_types=("bailing_moe_linear",), normalize=bailing_moe_linear, names=ring_names
)
