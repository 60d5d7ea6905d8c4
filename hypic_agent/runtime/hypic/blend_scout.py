"""The blend scout: where the question looks, on the cached prompt, before the combine.

``seam="blend"`` picks body tokens by ``attention mass the suffix gives them x predicted
deviation``. The mass comes from a *scout* forward: the combine's own work (a ``CombineWork`` in the
runner's layer loop, on the chunked path, no CUDA graphs) on the request's layout without blend rows
(seams and suffix active over the cached bodies), through its first ``n_layers`` layers. At every attention layer the
suffix's queries are scored against all keys (softmax over the causal row, as the layer attends),
and their probabilities are summed over heads, suffix rows and layers: ``mass[p]`` is how much the
question reads position ``p``. The scout's rows are computed again by the combine, so its cost
(active rows x ``n_layers`` / layers) is charged to the budget (``blend.BlendPlan``).
"""

from __future__ import annotations

from typing import Any

import torch

from hypic_agent.runtime.hypic.combine_inputs import combine_inputs
from hypic_agent.runtime.hypic.combine_work import CombineWork
from hypic_agent.runtime.hypic.entry import SegmentEntry
from hypic_agent.runtime.hypic.layout import CombineLayout
from hypic_agent.runtime.hypic.modes import mode_spec
from hypic_agent.runtime.models.hybrid import HybridForCausalLM
from hypic_agent.runtime.models.layers.attention import FullAttention
from hypic_agent.runtime.models.layers.decoder import DecoderLayer
from hypic_agent.runtime.models.layers.mla import MLAttention
from hypic_agent.runtime.runner.layer_loop import run_layers
from hypic_agent.runtime.runner.plan import plan_forward
from hypic_agent.runtime.state import AttentionLayerState

CHUNK = 1 << 24  # scores per chunk of suffix rows


def _suffix_mass(
    attn: FullAttention, q: torch.Tensor, k_full: torch.Tensor, lay: CombineLayout, n: int
) -> torch.Tensor:
    """Attention probabilities of the last ``n`` active rows over every key ``[L]``, summed over
    heads and rows (``k_full``: rotated keys ``[L, Hkv, D]``)."""
    pos = lay.active_pos[-n:]
    qs = attn.rotate(q[-n:], pos).float()  # [n, Hq, D]
    k = k_full.float().repeat_interleave(qs.shape[1] // k_full.shape[1], dim=1)  # [L, Hq, D]
    out = torch.zeros(k.shape[0], dtype=torch.float32, device=k.device)
    step = max(1, CHUNK // max(1, k.shape[0] * k.shape[1]))  # rows per chunk: bounded score memory
    for a in range(0, n, step):
        s = torch.einsum("qhd,khd->hqk", qs[a : a + step], k) * attn.scale
        s = s.masked_fill(lay.all_pos[None, None, :] > pos[a : a + step][None, :, None], float("-inf"))
        out += s.softmax(-1).sum((0, 1))
    return out


class _Scout(CombineWork):
    """The combine's own work on the scout's rows, adding up the suffix's attention mass at every
    attention layer (MLA layers read none: their keys are latent)."""

    def __init__(self, *args: Any, n_suffix: int, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.n_suffix = n_suffix
        self.mass = torch.zeros(self.lay.total, dtype=torch.float32, device=self.lay.active_ids.device)

    def mix(self, li: int, layer: DecoderLayer, xs: tuple[torch.Tensor, ...], rotated: bool = False) -> torch.Tensor:
        assert not rotated, "the scout reads un-rotated queries (it writes no pool: never in a CombineGroup)"
        o = super().mix(li, layer, xs)
        attn = layer.self_attn
        if attn is not None and not isinstance(attn, MLAttention):
            st = self.layers.pop()  # the spliced K/V of the whole prompt (this layer's only)
            assert isinstance(st, AttentionLayerState)
            self.mass += _suffix_mass(attn, xs[0], st.k, self.lay, self.n_suffix)
        elif self.layers:
            self.layers.pop()  # nothing of a layer is kept past it
        return o


@torch.no_grad()
def scout_mass(
    model: HybridForCausalLM,
    lay: CombineLayout,
    entries: list[SegmentEntry | None],
    n_suffix: int,
    n_layers: int,
) -> torch.Tensor:
    """``[L]`` attention mass the last ``n_suffix`` rows of ``lay`` give every position, over the
    attention layers among the first ``n_layers`` (see module doc); ``lay`` has no blend rows."""
    spec = mode_spec("hypic")
    inputs = combine_inputs(model, lay, entries, spec.transition, fused_scan=False)
    scout = _Scout(lay, entries, spec, inputs, n_suffix=n_suffix)
    plan = plan_forward(None, [], [], combines=(scout,), device=lay.active_ids.device)
    run_layers(model, plan, None, n_layers=n_layers)
    return scout.mass
