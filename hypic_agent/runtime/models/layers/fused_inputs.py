"""Projections that read the same input, run as one GEMM.

A decode step at batch 1 is bound by its number of kernels, not by its bytes: a Qwen3.5 MoE layer
reads its hidden state with four GDN input projections, or with the router and the shared expert's
gate, up and gate-scalar projections, each a separate small GEMM. ``fuse`` concatenates such
weights once into one ``[N1 + N2 + ..., D]`` tensor and turns each original parameter into a view
of its rows, so the state dict, ``load_weights`` and every reader of the old parameters see the
same memory (no copy of the weights stays behind). ``FusedInputs(x)`` returns the outputs as
column slices of one GEMM (strided views: consumers that need contiguous rows copy).

Inference only: the views do not require grad (``HybridForCausalLM.fuse_projections`` is called by
the engine and the serving benchmarks, never by training), and ``unfuse`` gives every parameter its
own storage back (``HybridForCausalLM`` does so around ``.to()``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class FusedInputs:
    weight: torch.Tensor  # [sum(sizes), D]
    sizes: tuple[int, ...]
    owners: tuple[tuple[nn.Module, str], ...]  # (module, attribute) of each part, in order
    requires_grad: tuple[bool, ...]  # each part's before ``fuse``

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x ``[T, D]`` -> one ``[T, N_i]`` column slice per fused projection."""
        return tuple(F.linear(x, self.weight).split(self.sizes, dim=-1))


def fuse(owners: Sequence[tuple[nn.Module, str]]) -> FusedInputs:
    """Concatenate the ``[N_i, D]`` weights ``getattr(module, attr)`` (bias-free) into one tensor and
    make each a view of its rows."""
    parts = [getattr(m, a) for m, a in owners]
    if any(p.dim() != 2 or p.shape[1] != parts[0].shape[1] for p in parts):
        raise ValueError(f"fused weights must be [N_i, D] with one D; got {[tuple(p.shape) for p in parts]}")
    grads = tuple(p.requires_grad for p in parts)
    weight = torch.cat([p.detach() for p in parts], dim=0)
    start = 0
    for (m, a), p in zip(owners, parts, strict=True):
        setattr(m, a, nn.Parameter(weight[start : start + p.shape[0]], requires_grad=False))
        start += p.shape[0]
    return FusedInputs(weight, tuple(p.shape[0] for p in parts), tuple(owners), grads)


def unfuse(fused: FusedInputs) -> None:
    """Give each part its own storage again (before a ``.to()``, whose copies would drop the views)."""
    for (m, a), grad in zip(fused.owners, fused.requires_grad, strict=True):
        setattr(m, a, nn.Parameter(getattr(m, a).detach().clone(), requires_grad=grad))
