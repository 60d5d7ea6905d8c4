"""Distillation losses and held-out metrics.

* ``kl_loss``: mean over tokens of KL(teacher || student) of the next-token distributions,
  computed over token chunks with activation checkpointing, so the ``[tokens, vocab]`` logits
  (49k wide for SmolLM2) exist for one chunk at a time, forward and backward.
* ``hidden_loss``: per-layer residual-stream MSE, each layer's normalized by the teacher's mean
  square at that layer (deep layers carry larger activations), averaged over layers.
* ``evaluate``: teacher / student perplexity, KL and top-1 agreement on held-out blocks.
  With a segment plan it also scores the student *as the ``hypic`` mode serves it* (segments
  cached in isolation, ``hypic_forward``) against the same one-pass teacher run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from hypic_agent.runtime.models.hybrid import HybridForCausalLM
from hypic_agent.training.hypic_forward import SegmentPlan, hypic_run


def _kl_sum(
    student: HybridForCausalLM, teacher: HybridForCausalLM, hs: torch.Tensor, ht: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Sum over the rows of KL(teacher || student); hs, ht ``[N, D]``."""
    with torch.no_grad():
        lt = F.log_softmax(teacher.logits(ht) / temperature, dim=-1)
    ls = F.log_softmax(student.logits(hs) / temperature, dim=-1)
    return (lt.exp() * (lt - ls)).sum()


def kl_loss(
    student: HybridForCausalLM,
    teacher: HybridForCausalLM,
    hs: torch.Tensor,
    ht: torch.Tensor,
    *,
    chunk: int = 4096,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Mean KL per token (x T^2). hs (student, with grad), ht (teacher): final residuals ``[B, L, D]``."""
    hs2, ht2 = hs.reshape(-1, hs.shape[-1]), ht.reshape(-1, ht.shape[-1]).detach()
    total = hs2.new_zeros((), dtype=torch.float32)
    for i in range(0, hs2.shape[0], chunk):
        a, b = hs2[i : i + chunk], ht2[i : i + chunk]
        if torch.is_grad_enabled() and a.requires_grad:
            part = checkpoint(_kl_sum, student, teacher, a, b, temperature, use_reentrant=False)
        else:
            part = _kl_sum(student, teacher, a, b, temperature)
        total = total + part
    return total / hs2.shape[0] * temperature**2


def hidden_loss(hs: Sequence[torch.Tensor], ht: Sequence[torch.Tensor]) -> torch.Tensor:
    """Mean over layers of ``mean((hs - ht)^2) / mean(ht^2)``; lists of ``[B, L, D]``."""
    terms = []
    for s, t in zip(hs, ht, strict=True):
        t = t.detach().float()
        terms.append((s.float() - t).pow(2).mean() / t.pow(2).mean().clamp_min(1e-12))
    return torch.stack(terms).mean()


RunFn = Callable[[HybridForCausalLM, torch.Tensor], torch.Tensor]  # (model, ids [B, L]) -> final [B, L, D]
CachedFn = Callable[[HybridForCausalLM, torch.Tensor, SegmentPlan], torch.Tensor]  # -> active finals [B, G, D]


@torch.no_grad()
def evaluate(
    student: HybridForCausalLM,
    teacher: HybridForCausalLM,
    blocks: torch.Tensor,
    run: RunFn,
    *,
    batch: int = 8,
    chunk: int = 4096,
    cached: tuple[SegmentPlan, CachedFn | None] | None = None,
) -> dict[str, float]:
    """Held-out metrics over ``blocks [N, L]``: ``teacher_ppl``, ``student_ppl`` (next-token),
    ``kl`` (nats/token, teacher || student) and ``top1`` (argmax agreement); ``tokens`` counted.

    ``cached = (plan, run_cached)`` (``L == plan.total``; ``run_cached`` defaults to ``hypic_run``)
    adds ``cached_kl`` / ``cached_top1`` at the active tokens (seams and suffix: the tokens whose
    outputs a cached prefill computes), against the same teacher run; ``cached_tokens`` counted."""
    dev = next(student.parameters()).device
    nll_t = nll_s = kl = agree = 0.0
    n_pred = n_tok = 0
    c_kl = c_agree = 0.0
    n_cached = 0
    for i in range(0, blocks.shape[0], batch):
        ids = blocks[i : i + batch].to(dev)
        hs, ht = run(student, ids), run(teacher, ids)
        if cached is not None:
            plan, run_cached = cached
            hc = (run_cached or (lambda m, x, p: hypic_run(m, x, p).final))(student, ids, plan)
            hta = ht[:, torch.tensor(plan.active_positions(), device=dev)]
            lc = F.log_softmax(student.logits(hc.reshape(-1, hc.shape[-1])).float(), -1)
            la = F.log_softmax(teacher.logits(hta.reshape(-1, hta.shape[-1])).float(), -1)
            c_kl += float((la.exp() * (la - lc)).sum())
            c_agree += float((la.argmax(-1) == lc.argmax(-1)).sum())
            n_cached += lc.shape[0]
        B, L = ids.shape
        hs2, ht2 = hs.reshape(B * L, -1), ht.reshape(B * L, -1)
        tgt = ids[:, 1:].reshape(-1)
        for j in range(0, B * L, chunk):
            ls = F.log_softmax(student.logits(hs2[j : j + chunk]), -1)
            lt = F.log_softmax(teacher.logits(ht2[j : j + chunk]), -1)
            kl += float((lt.exp() * (lt - ls)).sum())
            agree += float((lt.argmax(-1) == ls.argmax(-1)).sum())
            pos = torch.arange(j, j + ls.shape[0], device=dev)
            keep = (pos % L) != (L - 1)  # the last position of a block has no target
            y = tgt[((pos // L) * (L - 1) + pos % L)[keep]]
            nll_s -= float(ls[keep].gather(-1, y[:, None]).sum())
            nll_t -= float(lt[keep].gather(-1, y[:, None]).sum())
            n_pred += int(keep.sum())
        n_tok += B * L
    out = {
        "teacher_ppl": math.exp(nll_t / n_pred),
        "student_ppl": math.exp(nll_s / n_pred),
        "kl": kl / n_tok,
        "top1": agree / n_tok,
        "tokens": float(n_tok),
    }
    if n_cached:
        out.update(cached_kl=c_kl / n_cached, cached_top1=c_agree / n_cached, cached_tokens=float(n_cached))
    return out
