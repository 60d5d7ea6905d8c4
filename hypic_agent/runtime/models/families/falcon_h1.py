"""TII Falcon-H1 (``falcon_h1``).

Every checkpoint layer runs a Mamba2 mixer and GQA RoPE attention in parallel on one normed input,
then a SwiGLU MLP; µP multipliers scale the embeddings, each branch's input and output, the Mamba2
input projection per section (``ssm_multipliers``: z, x, B, C, dt), the MLP's gate and output and
the logits. We serve checkpoint layer i as our layers 2i (its Mamba2 half: ``linear``) and 2i+1 (its
attention half and the MLP: ``attention``), see ``layers/parallel_layer.py``. Falcon-H1's ``key_multiplier``
scales the keys before RoPE: we fold it into the attention scale (the cached keys stay unscaled).

Checkpoint names: checkpoint layer i -> our layers 2i (``input_layernorm``, ``mamba`` -> ``linear_attn``)
and 2i+1 (``self_attn``, ``pre_ff_layernorm`` -> ``post_attention_layernorm``, ``feed_forward`` -> ``mlp``).

GGUF ``falcon-h1``: what llama.cpp's converter (``FalconH1Model``, a ``Mamba2Model``) does to a
checkpoint, and how we read it back:


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
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from hypic_agent.errors import ModelConfigError
from hypic_agent.runtime.models.config import HybridConfig, LayerKind, ParallelScales
from hypic_agent.runtime.models.families.common import (
    LAYER,
    Family,
    Tensors,
    gqa_heads,
    hybrid_config,
    json_float,
    mamba_leaf,
    rope_of,
)
from hypic_agent.runtime.models.loading.gguf_meta import GGUFFamily, GGUFMeta, common_config, mamba2_dims


# ---------------------------------------------------------------------------- config.json
def _scales(raw: dict[str, Any]) -> ParallelScales:
    sections = tuple(float(m) for m in (raw.get("ssm_multipliers") or (1.0,) * 5))
    gate, down = (float(m) for m in (raw.get("mlp_multipliers") or (1.0, 1.0)))
    if len(sections) != 5:
        raise ModelConfigError(f"ssm_multipliers needs 5 entries (z, x, B, C, dt), got {len(sections)}")
    norm = "none"
    if raw.get("mamba_rms_norm", False):
        norm = "norm_then_gate" if raw.get("mamba_norm_before_gate", True) else "gate_then_norm"
    return ParallelScales(
        attention_in=float(raw.get("attention_in_multiplier", 1.0)),
        attention_out=float(raw.get("attention_out_multiplier", 1.0)),
        ssm_in=float(raw.get("ssm_in_multiplier", 1.0)),
        ssm_out=float(raw.get("ssm_out_multiplier", 1.0)),
        ssm_sections=sections,  # type: ignore[arg-type]
        mlp_gate=gate,
        mlp_down=down,
        ssm_norm=norm,
    )


def falcon_h1(raw: dict[str, Any], model_type: str) -> HybridConfig:
    n = int(raw["num_hidden_layers"])
    if str(raw.get("hidden_act", "silu")) != "silu":
        raise ModelConfigError(f"Falcon-H1 with hidden_act {raw['hidden_act']!r} is not supported (only silu)")
    if raw.get("mlp_bias"):
        raise ModelConfigError("Falcon-H1 with mlp_bias is not supported yet")
    hidden = int(raw["hidden_size"])
    heads = gqa_heads(raw, kv_default=True)
    head_dim = heads[2]
    m_heads = int(raw.get("mamba_n_heads", 128))
    d_ssm = raw.get("mamba_d_ssm", 1024)
    inner = int(raw.get("mamba_expand", 2)) * hidden if d_ssm is None else int(d_ssm)
    d_head = raw.get("mamba_d_head", "auto")
    d_head = inner // m_heads if d_head in (None, "auto") else int(d_head)
    if d_head * m_heads != inner:
        raise ModelConfigError(f"mamba_d_head {d_head} x mamba_n_heads {m_heads} != the Mamba2 width {inner}")
    limit = raw.get("time_step_limit") or (0.0, float("inf"))
    kinds: tuple[LayerKind, ...] = ("linear", "attention") * n
    base = hybrid_config(
        raw, model_type, "falcon_h1", kinds, heads=heads, rope=rope_of(raw, head_dim), eps=1e-5, max_positions=8192,
        read_act=False,  # silu, checked above
    )  # fmt: skip
    return replace(
        base,
        attention_scale=float(raw.get("key_multiplier", 1.0)) * head_dim**-0.5,
        linear_kind="mamba2",
        linear_num_key_heads=int(raw.get("mamba_n_groups", 1)),
        linear_num_value_heads=m_heads,
        linear_key_head_dim=int(raw.get("mamba_d_state", 256)),
        linear_value_head_dim=d_head,
        linear_conv_kernel_dim=int(raw.get("mamba_d_conv", 4)),
        linear_conv_bias=bool(raw.get("mamba_conv_bias", True)),
        linear_proj_bias=bool(raw.get("mamba_proj_bias", False)),
        linear_out_bias=bool(raw.get("projectors_bias", False)),
        linear_dt_limit=(json_float(limit[0]), json_float(limit[1])),
        ffn_layers=(False, True) * n,  # the MLP sits in each attention half
        intermediate_size=int(raw["intermediate_size"]),
        embedding_multiplier=float(raw.get("embedding_multiplier", 1.0)),
        logits_scaling=1.0 / float(raw.get("lm_head_multiplier", 1.0)),
        parallel=_scales(raw),
    )


# ---------------------------------------------------------------------------- checkpoint names
_FALCON_LAYER = re.compile(
    r"^model\.layers\.(\d+)\.(input_layernorm|mamba|self_attn|pre_ff_layernorm|feed_forward)\.(.+)$"
)
_FALCON_HALF = {  # checkpoint module -> (which of our two layers, our module)
    "input_layernorm": (0, "input_layernorm"),
    "mamba": (0, "linear_attn"),
    "self_attn": (1, "self_attn"),
    "pre_ff_layernorm": (1, "post_attention_layernorm"),
    "feed_forward": (1, "mlp"),
}


def falcon_names(cfg: HybridConfig, tensors: Tensors) -> Tensors:
    """Falcon-H1 checkpoint layer i -> our layers 2i (``input_layernorm``, ``mamba`` -> ``linear_attn``) and
    2i+1 (``self_attn``, ``pre_ff_layernorm`` -> ``post_attention_layernorm``, ``feed_forward`` -> ``mlp``);
    ``final_layernorm`` -> ``norm``; a stored ``mup_vector`` dropped (recomputed from the config). Both
    namings share ``input_layernorm`` / ``self_attn``: a dict is in transformers' naming when it holds
    one of its own names, else it passes through."""
    if not any(".mamba." in k or ".feed_forward." in k or "final_layernorm" in k for k in tensors):
        return tensors
    out: Tensors = {}
    for k, v in tensors.items():
        m = _FALCON_LAYER.match(k)
        if k.endswith(".mup_vector"):
            continue
        if m is None:
            out[k.replace("model.final_layernorm.", "model.norm.")] = v
            continue
        half, module = _FALCON_HALF[m[2]]
        out[f"model.layers.{2 * int(m[1]) + half}.{module}.{m[3]}"] = v
    return out


# ---------------------------------------------------------------------------- GGUF
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
    m = LAYER.match(name)
    if m is None:
        return name
    layer, block, leaf = int(m[1]), m[2], m[3]
    pre = f"model.layers.{layer // 2}."
    if layer % 2 == 0:
        return pre + ("mamba." + mamba_leaf(leaf) if block == "linear_attn" else f"{block}.{leaf}")
    return pre + f"{_ATTENTION_HALF.get(block, block)}.{leaf}"


FAMILY = Family(
    name="falcon_h1",
    model_types=("falcon_h1",),
    normalize=falcon_h1,
    names=falcon_names,
    gguf=(GGUFFamily("falcon-h1", "falcon_h1", "FALCON_H1", config=falcon_h1_config, hub=falcon_h1_hub),),
)
