"""Per-step schedule of a distillation run: learning rate and which steps train cached prefill.

Both are functions of (config, step[, elapsed time]) only, so a resumed run continues exactly.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from hypic_agent.errors import InvalidRequestError
from hypic_agent.training.hypic_forward import SegmentPlan, plan_for

if TYPE_CHECKING:
    from hypic_agent.training.distill import DistillConfig


def lr_at(cfg: DistillConfig, step: int, elapsed_s: float = 0.0) -> float:
    """Linear warmup to ``lr`` over ``warmup`` steps, then cosine to ``min_lr_ratio * lr`` at ``steps``
    (or, when ``steps == 0``, at ``time_budget_s`` seconds of training)."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    if cfg.steps > 0:
        frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    else:
        frac = elapsed_s / cfg.time_budget_s if cfg.time_budget_s else 0.0
    frac = min(1.0, frac)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def cached_plan(cfg: DistillConfig, step: int) -> SegmentPlan | None:
    """The segment plan of a cached-prefill step, or None for a plain step."""
    if cfg.cached_every <= 0 or step % cfg.cached_every != cfg.cached_every - 1:
        return None
    g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
    lens = [n for n in cfg.cached_segment_lens if n + cfg.cached_min_suffix <= cfg.seq]
    if not lens or not cfg.cached_seams:
        raise InvalidRequestError(
            f"no cached segment length fits --seq {cfg.seq} with a suffix of {cfg.cached_min_suffix}",
            param="cached_segment_lens",
        )
    n = lens[int(torch.randint(len(lens), (1,), generator=g))]
    w = cfg.cached_seams[int(torch.randint(len(cfg.cached_seams), (1,), generator=g))]
    return plan_for(cfg.seq, n, min(w, n - 1), cfg.cached_min_suffix)
