"""``ParallelScales``: a layer whose SSM and attention mixers run side by side on one normed input
(Falcon-H1), with the µP multipliers of each branch.

Falcon-H1's layer: ``x = norm(h)``; ``y = ssm_out * mamba(ssm_in * x) + attn_out * attn(attn_in * x)``
(the Mamba2 input projection's output times ``mup`` per section z / x / B / C / dt); ``h + y``; then
the MLP ``down(up(x) * silu(gate(x) * mlp_gate)) * mlp_down``. The runtime serves it as two
consecutive layers (``parallel_layer``); these numbers are all they need besides the usual shapes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ParallelScales:
    attention_in: float = 1.0
    attention_out: float = 1.0
    ssm_in: float = 1.0
    ssm_out: float = 1.0
    ssm_sections: tuple[float, float, float, float, float] = (1.0, 1.0, 1.0, 1.0, 1.0)  # z, x, B, C, dt
    mlp_gate: float = 1.0
    mlp_down: float = 1.0
    # the SSM output's gate: "none" (``y * silu(z)``), "norm_then_gate" (``w * rms_G(y) * silu(z)``) or
    # "gate_then_norm" (``w * rms_G(y * silu(z))``, the Mamba2 default)
    ssm_norm: str = "none"
