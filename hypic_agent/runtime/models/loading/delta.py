"""The distilled model on disk: a Hugging Face folder holding only what its base model lacks.

::

    config.json              qwen3_5_text config + "hypic_delta": {base, mapping, files}
    model*.safetensors       the new / changed tensors (mixers), shards; int8 matrices with their
                             group scales beside them (``name + QSCALE``)
    tokenizer.json, ...      the teacher's tokenizer (+ chat template)
    distill.json             training summary and held-out metrics

``base`` names the teacher weights (catalog name + sha256 of the GGUF, or a path, or the tiny seed);
everything not stored (embeddings, MLPs, norms) is rebuilt from them by the fixed mapping
``derived_tensors`` (named ``MAPPING_NAME``). ``training/delta.py`` writes such folders;
``weights.load_delta`` reads them (``weights.load_checkpoint`` does for any folder whose config.json
has ``DELTA_KEY``).
"""

from __future__ import annotations

import torch

DELTA_KEY = "hypic_delta"
QSCALE = ".qscale"  # int8 export: scales of tensor ``name`` stored as ``name + QSCALE``
MAPPING_NAME = "llama_to_qwen3_5_hybrid/v1"


def derived_tensors(teacher: dict[str, torch.Tensor], tie: bool) -> dict[str, torch.Tensor]:
    """Student tensors that are a fixed function of the teacher's: embeddings, MLPs, norms (w - 1)."""
    out: dict[str, torch.Tensor] = {}
    for name, t in teacher.items():
        if ".self_attn." in name or (tie and name == "lm_head.weight"):
            continue
        out[name] = t - 1.0 if name.endswith("layernorm.weight") or name == "model.norm.weight" else t.clone()
    return out


def unpack(stored: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Stored tensors as they were before ``training.delta.pack`` (int8 matrices dequantized to fp32;
    other tensors as stored)."""
    out: dict[str, torch.Tensor] = {}
    for name, t in stored.items():
        if name.endswith(QSCALE):
            continue
        scale = stored.get(name + QSCALE)
        if scale is not None:
            g = t.reshape(t.shape[0], scale.shape[1], -1).float()
            t = (g * scale[..., None].float()).reshape(t.shape)
        out[name] = t
    return out
