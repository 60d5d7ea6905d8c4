"""``RequestState``: everything a request needs to continue decoding.

Every mode (full recompute, prefix cache, HYPIC combine, ...) produces one; only how it is built
differs. Per layer it holds either the linear-attention recurrent + conv state or the attention KV.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class LinearLayerState:
    recurrent: torch.Tensor  # [HV, K, V] fp32
    conv: torch.Tensor  # [C, W-1] last W-1 conv inputs

    def nbytes(self) -> int:
        return self.recurrent.nbytes + self.conv.nbytes

    def clone(self) -> LinearLayerState:
        return LinearLayerState(self.recurrent.clone(), self.conv.clone())


@dataclass
class AttentionLayerState:
    k: torch.Tensor  # [L, Hkv, D] rotated at positions 0..L-1 (MLA: rope keys [L, 1, rope])
    v: torch.Tensor  # [L, Hkv, D] (MLA: latents [L, 1, kv_lora_rank])

    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def clone(self) -> AttentionLayerState:
        return AttentionLayerState(self.k.clone(), self.v.clone())


LayerState = LinearLayerState | AttentionLayerState


@dataclass
class RequestState:
    """Working state after ``length`` tokens; ``last_logits [vocab]`` predicts token ``length``."""

    layers: list[LayerState]
    length: int
    last_logits: torch.Tensor | None = None
    tokens: list[int] = field(default_factory=list)

    def nbytes(self) -> int:
        return sum(s.nbytes() for s in self.layers)

    def clone(self) -> RequestState:
        return RequestState(
            [s.clone() for s in self.layers],
            self.length,
            None if self.last_logits is None else self.last_logits.clone(),
            list(self.tokens),
        )
