"""GGUF ``falcon-h1`` (TII Falcon-H1) -> a ``falcon_h1`` config dict and our tensor names.

What llama.cpp's converter (``FalconH1Model``, a ``Mamba2Model``) does to a checkpoint, and how we
read it back:

* the µP multipliers are **folded into the weights** and not stored: ``embed_tokens`` x
  ``embedding_multiplier``, ``lm_head`` x ``lm_head_multiplier``, q / v x ``attention_in_multiplier``,
  k x ``key_multiplier`` x ``attention_in_multiplier``, o x ``attention_out_multiplier``, the MLP gate
  x ``mlp_multipliers[0]`` and down x ``mlp_multipliers[1]``, the Mamba2 ``in_proj`` x
  ``ssm_in_multiplier`` and its z / x / B / C / dt row blocks x ``ssm_multipliers``, ``out_proj`` x
  ``ssm_out_multiplier``. The file's weights are therefore the model with every multiplier 1, which
  is the config we build: same logits as the HF folder (up to fp32 rounding of the folded products).
* Mamba2 conventions as for Granite 4 / Nemotron-H (``A = -exp(A_log)`` as ``[H, 1]``, ``D`` as
  ``[H, 1]``, ``dt_bias`` as ``ssm_dt.bias``, the conv kernel squeezed, the grouped norm as
  ``[G, inner / G]``); attention Q/K rows are *not* permuted (the converter's Mamba2 path writes them
  as they are: NeoX-style RoPE, as transformers').
* the file does not say whether the grouped RMSNorm runs before or after the ``silu(z)`` gate
  (``mamba_norm_before_gate``): llama.cpp's Mamba2 graph gates first, then norms (when the norm
  tensor exists), so that is what we build. A checkpoint trained with the norm before the gate runs
  differently under llama.cpp and under us from its GGUF than from its HF folder.

* a checkpoint with tied embeddings has no ``lm_head`` to carry ``lm_head_multiplier``: its GGUF has
  only the embedding (x ``embedding_multiplier``), used as the output too, by llama.cpp and by us,
  which differs from the HF model unless the two multipliers agree (released Falcon-H1 models
  untie them).

Each checkpoint layer holds a Mamba2 mixer and attention in parallel; we serve layer ``i`` as our
layers ``2i`` (Mamba2 half) and ``2i + 1`` (attention half and MLP), see ``parallel_layer``.
"""

from __future__ import annotations

import re
from typing import Any

from hypic_agent.errors import ModelConfigError
from hypic_agent.runtime.models.config import HybridConfig
from hypic_agent.runtime.models.gguf_families import mamba_leaf
from hypic_agent.runtime.models.loading.gguf_meta import GGUFFamily, GGUFMeta, common_config, mamba2_dims

_LAYER = re.compile(r"^model\.layers\.(\d+)\.([a-z_]+)\.(.+)$")
_ATTENTION_HALF = {"self_attn": "self_attn", "post_attention_layernorm": "pre_ff_layernorm", "mlp": "feed_forward"}


def falcon_h1_config(meta: GGUFMeta) -> dict[str, Any]:
    """``falcon-h1`` metadata -> a config.json dict, every multiplier 1 (they are in the weights)."""
    n = int(meta.require("block_count"))
    heads = int(meta.require("attention.head_count"))
    kv = meta.get("attention.head_count_kv", heads)
    if isinstance(kv, list):
        raise ModelConfigError("GGUF falcon-h1 with per-layer head_count_kv is not supported", param="model")
    m_heads, m_head_dim, groups, state, kernel = mamba2_dims(meta)
    has = lambda suffix: any(k.endswith(suffix) for k in meta.shapes)  # noqa: E731
    return {
        "model_type": "falcon_h1",
        **common_config(meta),
        "num_hidden_layers": n,
        "num_attention_heads": heads,
        "num_key_value_heads": int(kv),
        "head_dim": int(meta.require("attention.key_length")),
        "intermediate_size": int(meta.require("feed_forward_length")),
        "max_position_embeddings": int(meta.get("context_length", 8192)),
        "rms_norm_eps": float(meta.get("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_parameters": {"rope_type": "default", "rope_theta": float(meta.get("rope.freq_base", 10000.0))},
        "attention_bias": has("attn_q.bias"),
        "mamba_d_ssm": m_heads * m_head_dim,
        "mamba_n_heads": m_heads,
        "mamba_d_head": m_head_dim,
        "mamba_n_groups": groups,
        "mamba_d_state": state,
        "mamba_d_conv": kernel,
        "mamba_conv_bias": has("ssm_conv1d.bias"),
        "mamba_proj_bias": has("ssm_in.bias"),
        "projectors_bias": has("ssm_out.bias"),
        "mamba_rms_norm": has("ssm_norm.weight"),
        "mamba_norm_before_gate": False,  # llama.cpp's Mamba2 graph: y * silu(z), then the norm
    }


def falcon_h1_hub(cfg: HybridConfig, name: str) -> str:
    """Our layer ``2i`` / ``2i + 1`` tensor -> checkpoint layer ``i``'s name (``mamba`` /
    ``self_attn``, ``pre_ff_layernorm``, ``feed_forward``), as the converter reads it."""
    if name == "model.norm.weight":
        return "model.final_layernorm.weight"
    m = _LAYER.match(name)
    if m is None:
        return name
    layer, block, leaf = int(m[1]), m[2], m[3]
    pre = f"model.layers.{layer // 2}."
    if layer % 2 == 0:
        return pre + ("mamba." + mamba_leaf(leaf) if block == "linear_attn" else f"{block}.{leaf}")
    return pre + f"{_ATTENTION_HALF.get(block, block)}.{leaf}"


FALCON_H1 = GGUFFamily("falcon-h1", "falcon_h1", "FALCON_H1", config=falcon_h1_config, hub=falcon_h1_hub)
