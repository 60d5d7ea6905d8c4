"""The tiny Falcon-H1 config (``tiny:falcon_h1``; merged over ``tiny._COMMON``).

2 checkpoint layers (our 4: Mamba2 half, attention half, twice), each running Mamba2 (4 heads x 32,
d_state 16, 2 groups; the group RMSNorm before the output gate) and RoPE attention in parallel; every
µP multiplier set away from 1, so a multiplier left out shows in the logits.
"""

from __future__ import annotations

from typing import Any

FALCON_TINY: dict[str, Any] = {
    "num_hidden_layers": 2,
    "mamba_d_ssm": 128,
    "mamba_n_heads": 4,
    "mamba_d_head": 32,
    "mamba_n_groups": 2,
    "mamba_d_state": 16,
    "mamba_d_conv": 4,
    "mamba_chunk_size": 16,
    "mamba_rms_norm": True,
    "mamba_norm_before_gate": True,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "embedding_multiplier": 2.0,
    "lm_head_multiplier": 0.5,
    "key_multiplier": 0.8,
    "attention_in_multiplier": 1.1,
    "attention_out_multiplier": 0.9,
    "ssm_in_multiplier": 1.2,
    "ssm_out_multiplier": 0.7,
    "ssm_multipliers": [0.9, 1.1, 0.8, 1.25, 0.6],
    "mlp_multipliers": [1.3, 0.75],
    "tie_word_embeddings": False,
}
