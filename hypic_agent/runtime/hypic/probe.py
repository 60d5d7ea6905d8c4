"""``probe``: the combine forward, keeping every active row of every layer (for measurements).

``combine`` keeps only the last token's logits. Measuring where cached prefill deviates needs
the per-token hidden states: this runs the same forward (the runner's layer loop over one
``CombineWork`` on the chunked path, no CUDA graphs, no cold batch) with a ``hidden`` hook that
keeps the residual stream of every active token entering every layer plus after the last one, and
the active tokens' logits. Three layouts cover what a deviation measurement compares:

* no entries (``plan_layout(segs, [None] * n, ...)``): every token active, the one-pass forward
  (``full_recompute``);
* one segment alone with no entry and no suffix: its isolated prefill, i.e. what an entry caches
  for its body tokens;
* entries + seams: the ``hypic`` forward (active rows = seams and suffix).

Not on any serving path (it keeps ``[n_layers + 1, T, D]`` hidden states).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hypic_agent.runtime.hypic.combine_inputs import combine_inputs
from hypic_agent.runtime.hypic.combine_work import CombineWork
from hypic_agent.runtime.hypic.entry import SegmentEntry
from hypic_agent.runtime.hypic.layout import CombineLayout
from hypic_agent.runtime.hypic.modes import ModeSpec
from hypic_agent.runtime.models.hybrid import HybridForCausalLM
from hypic_agent.runtime.runner.layer_loop import run_layers
from hypic_agent.runtime.runner.plan import plan_forward


@dataclass
class Probe:
    hidden: torch.Tensor  # [n_layers + 1, Ta, D] residual entering layer l (l = n_layers: after the last)
    logits: torch.Tensor | None  # [Ta, vocab] fp32 (None when not asked for)
    positions: torch.Tensor  # [Ta] global positions of the rows


@torch.no_grad()
def probe(
    model: HybridForCausalLM,
    lay: CombineLayout,
    entries: list[SegmentEntry | None],
    spec: ModeSpec,
    *,
    logits: bool = True,
) -> Probe:
    """Run the combine forward of ``lay`` and keep all active rows (see module doc)."""
    inputs = combine_inputs(model, lay, entries, spec.transition, fused_scan=False)
    plan = plan_forward(None, [], [], combines=(CombineWork(lay, entries, spec, inputs),), device=lay.active_ids.device)
    width = model.config.hidden_size  # the residual (a Falcon-H1 SSM half passes [h | x | m] on)
    hidden: list[torch.Tensor] = []
    final: list[torch.Tensor] = []

    def keep(li: int, h: torch.Tensor) -> None:
        hidden.append(h[:, :width])
        if li == len(model.layers):
            final.append(h)

    run_layers(model, plan, None, hidden=keep)
    return Probe(torch.stack(hidden), model.logits(final[0]) if logits else None, lay.active_pos)
