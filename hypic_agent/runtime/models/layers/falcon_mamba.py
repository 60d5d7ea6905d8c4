"""Falcon-H1's Mamba2 mixer: ``Mamba2Mixer`` with the µP multipliers of its branch.

* input: ``in_proj(ssm_in * x) * mup``, ``mup`` one multiplier per section of the projection
  (z, x, B, C, dt: ``ParallelScales.ssm_sections``; transformers' ``compute_mup_vector``);
* output gate: ``y * silu(z)`` without a norm (``mamba_rms_norm`` off, the usual checkpoint), else the
  group RMSNorm before the gate (``mamba_norm_before_gate``) or after it (the Mamba2 default);
* ``out_proj(...) * ssm_out``.

Everything between (conv, scan, pairs, decode) is Mamba2's, so entries, pool slots and combine are
unchanged: a segment's pair is the per-head decay ``T [H]`` and ``S [H, N, P]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hypic_agent.runtime.models.config import HybridConfig
from hypic_agent.runtime.models.layers.mamba2 import Mamba2Mixer


class FalconMamba2(Mamba2Mixer):
    def __init__(self, cfg: HybridConfig) -> None:
        super().__init__(cfg)
        scales = cfg.parallel
        assert scales is not None
        self.ssm_in, self.ssm_out, self.gate_mode = scales.ssm_in, scales.ssm_out, scales.ssm_norm
        gn = self.g_heads * self.dk
        widths = (self.inner, self.inner, gn, gn, self.hv)  # z, x, B, C, dt
        mup = torch.cat([torch.full((n,), m) for n, m in zip(widths, scales.ssm_sections, strict=True)])
        self.mup: torch.Tensor
        self.register_buffer("mup", mup, persistent=False)  # transformers recomputes it from the config too
        if self.gate_mode == "none":
            del self.norm  # no weight in the checkpoint

    def project(self, x: torch.Tensor) -> torch.Tensor:
        if self.ssm_in != 1.0:
            x = x * self.ssm_in
        return self.in_proj(x) * self.mup

    def output(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """y ``[T, H, P]``, z ``[T, inner]`` -> ``[T, D]``: the gate (and norm), ``out_proj``, ``ssm_out``."""
        t = o.shape[0]
        y = o.reshape(t, self.inner)
        if self.gate_mode == "gate_then_norm":
            y = self.norm(y, z)
        elif self.gate_mode == "norm_then_gate":
            grp = y.float().view(t, self.norm.groups, -1)
            grp = grp * torch.rsqrt(grp.pow(2).mean(-1, keepdim=True) + self.norm.eps)
            y = ((self.norm.weight * grp.view(t, -1)) * F.silu(z.float())).to(y.dtype)
        else:
            y = (y * F.silu(z)).to(o.dtype)
        out = self.out_proj(y)
        return out if self.ssm_out == 1.0 else out * self.ssm_out
