"""Checkpoint names of the families whose transformers modules are named differently from ours.

Our modules keep one naming for every family (``model.layers.{i}.linear_attn`` for any linear
mixer, ``self_attn.{q,k,v,o}_proj`` / ``q_norm`` / ``k_norm``, ``input_layernorm`` /
``post_attention_layernorm``, ``mlp.{gate,up,down}_proj`` or ``mlp.{gate,experts,shared_expert}``,
``model.norm``). ``to_contract`` renames (and where a tensor is fused, splits) transformers' names
of ``lfm2`` and ``granitemoehybrid`` into it; names already in our naming pass through, so it is
safe to apply twice. Other families are returned as they are.
"""

from __future__ import annotations

import re

import torch

from hypic_agent.runtime.models.config import HybridConfig

_LAYER = r"^(model\.layers\.\d+\.)"

_LFM2: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"^model\.embedding_norm\."), "model.norm."),
    (re.compile(_LAYER + r"conv\."), r"\1linear_attn."),
    (re.compile(_LAYER + r"self_attn\.out_proj\."), r"\1self_attn.o_proj."),
    (re.compile(_LAYER + r"self_attn\.q_layernorm\."), r"\1self_attn.q_norm."),
    (re.compile(_LAYER + r"self_attn\.k_layernorm\."), r"\1self_attn.k_norm."),
    (re.compile(_LAYER + r"operator_norm\."), r"\1input_layernorm."),
    (re.compile(_LAYER + r"ffn_norm\."), r"\1post_attention_layernorm."),
    (re.compile(_LAYER + r"feed_forward\.w1\."), r"\1mlp.gate_proj."),
    (re.compile(_LAYER + r"feed_forward\.w3\."), r"\1mlp.up_proj."),
    (re.compile(_LAYER + r"feed_forward\.w2\."), r"\1mlp.down_proj."),
]

_GRANITE: list[tuple[re.Pattern[str], str]] = [
    (re.compile(_LAYER + r"mamba\."), r"\1linear_attn."),
    (re.compile(_LAYER + r"block_sparse_moe\.router\.(layer\.)?weight$"), r"\1mlp.gate.weight"),
    (re.compile(_LAYER + r"block_sparse_moe\.experts\."), r"\1mlp.experts."),
    # the older GraniteMoe layout of the same expert tensors ([E, 2I, D] / [E, D, I])
    (re.compile(_LAYER + r"block_sparse_moe\.input_linear\.weight$"), r"\1mlp.experts.gate_up_proj"),
    (re.compile(_LAYER + r"block_sparse_moe\.output_linear\.weight$"), r"\1mlp.experts.down_proj"),
]
_SHARED = re.compile(_LAYER + r"shared_mlp\.(input|output)_linear\.weight$")


def _rename(name: str, rules: list[tuple[re.Pattern[str], str]]) -> str:
    for pat, rep in rules:
        name, n = pat.subn(rep, name)
        if n:
            return name
    return name


def to_contract(cfg: HybridConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' tensor names of ``cfg.family`` -> ours (see module doc)."""
    if cfg.family == "lfm2":
        return {_rename(k, _LFM2): v for k, v in tensors.items()}
    if cfg.family != "granitemoehybrid":
        return tensors
    out: dict[str, torch.Tensor] = {}
    for k, v in tensors.items():
        m = _SHARED.match(k)
        if m is None:
            out[_rename(k, _GRANITE)] = v
            continue
        pre = m[1] + ("mlp.shared_expert." if cfg.num_experts else "mlp.")
        if m[2] == "input":  # [2I, D] = cat(gate, up)
            gate, up = v.chunk(2, dim=0)
            out[pre + "gate_proj.weight"], out[pre + "up_proj.weight"] = gate, up
        else:
            out[pre + "down_proj.weight"] = v
    return out
