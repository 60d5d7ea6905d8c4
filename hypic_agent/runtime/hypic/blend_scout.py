"""The blend scout: where the question looks, on the cached prompt, before the combine.

``seam="blend"`` picks body tokens by ``attention mass the suffix gives them x predicted
deviation``. The mass comes from a *scout* forward: the combine's own per-layer code (``probe``'s
chunked path, no CUDA graphs) on the request's layout without blend rows (seams and suffix active
over the cached bodies), through its first ``n_layers`` layers. At every attention layer the
suffix's queries are scored against all keys (softmax over the causal row, as the layer attends),
and their probabilities are summed over heads, suffix rows and layers: ``mass[p]`` is how much the
question reads position ``p``. The scout's rows are computed again by the combine, so its cost
(active rows x ``n_layers`` / layers) is charged to the budget (``blend.BlendPlan``).
"""

from __future__ import annotations

import torch

from hypic_agent.runtime.hypic.combine_attention import combine_attention
from hypic_agent.runtime.hypic.combine_inputs import combine_inputs
from hypic_agent.runtime.hypic.combine_linear import combine_linear
from hypic_agent.runtime.hypic.entry import SegmentEntry
from hypic_agent.runtime.hypic.layout import CombineLayout
from hypic_agent.runtime.hypic.modes import mode_spec
from hypic_agent.runtime.models.attention import FullAttention
from hypic_agent.runtime.models.hybrid import HybridForCausalLM
from hypic_agent.runtime.models.mla import MLAttention

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
    mass = torch.zeros(lay.total, dtype=torch.float32, device=lay.active_ids.device)
    h = model.embed(lay.active_ids)
    for li, layer in enumerate(model.layers[:n_layers]):
        xs = layer.mixer_in(h)
        if layer.linear_attn is not None:
            o, _ = combine_linear(layer.linear_attn, xs, lay, entries, li, spec, None, None, None, inputs.kernels)
            extra: tuple[torch.Tensor, ...] = xs[1:2]
        else:
            attn = layer.self_attn
            assert attn is not None
            q, k, v = xs[:3]
            o, st = combine_attention(attn, q, k, v, lay, entries, li, spec, None)
            if not isinstance(attn, MLAttention):  # MLA layers: no mass read (their keys are latent)
                mass += _suffix_mass(attn, q, st.k, lay, n_suffix)
            extra = xs[3:]
        if li + 1 < n_layers:
            h = layer.mixer_out(h, o, *extra)
    return mass
