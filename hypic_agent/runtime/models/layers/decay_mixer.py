"""``DecayMixer``: the HYPIC half shared by every decay-only linear mixer (Mamba2, Lightning).

Their recurrence is ``S_t = exp(g_t) S_{t-1} + k_t v_t^T`` with a scalar log-decay per head
(``kernels.decay_attention``: fla-core's ``chunk_simple_gla`` on CUDA, the torch twin elsewhere),
so a span's pair is ``T [HV]`` (its cumulative decay) and ``S [HV, K, V]``, composed as
``T * S_in + S``. A subclass says how its operands map onto (q, k, v, g) (``decay_operands``) and
what it adds to the scan's output (``finish``: Mamba2's D skip). The decode step stays in torch.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hypic_agent.kernels import decay_attention as decay_ops
from hypic_agent.kernels.config import DEFAULT_KERNELS, KernelConfig
from hypic_agent.kernels.gdn_pairs import PairSink, SeamSplit


class DecayMixer(nn.Module):
    hv: int
    backend: str  # kernel backend of the prefill scan and the pairs (``auto`` | ``torch`` | ``fla``)
    slopes: list[float]  # per-head decay slopes (the slope kinds: Lightning, Ring-linear)
    _slope: dict[torch.device, torch.Tensor]
    kernels: KernelConfig = DEFAULT_KERNELS  # ``recurrent_scan_max_tokens`` (``HybridForCausalLM.set_kernels``)

    def slope_log_decays(self, like: torch.Tensor) -> torch.Tensor:
        """``[T, HV]`` fp32 log-decays ``-s_h`` of a slope kind (T = ``like``'s rows), cached per device
        (not a buffer: no dtype cast)."""
        cache = getattr(self, "_slope", None)
        if cache is None:
            cache = self._slope = {}
        s = cache.get(like.device)
        if s is None:
            s = cache[like.device] = -torch.tensor(self.slopes, dtype=torch.float32, device=like.device)
        return s.expand(like.shape[0], self.hv)

    def decay_operands(self, ops: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> q ``[T, G, K]``, k ``[T, G, K]``, v ``[T, HV, V]``, g ``[T, HV]`` (log-decay, fp32)."""
        raise NotImplementedError

    def finish(self, o: torch.Tensor, ops: Any) -> torch.Tensor:
        """The scan's output ``[T, HV, V]`` fp32 -> the mixer's output."""
        return o

    def mix(
        self, ops: Any, cu_seqlens: torch.Tensor | None, initial_state: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (output, final states ``[N, HV, K, V]`` fp32)."""
        q, k, v, g = self.decay_operands(ops)
        o, final = decay_ops.decay_attention(
            q, k, v, g, cu_seqlens=cu_seqlens, initial_state=initial_state, backend=self.backend,
            recurrent_max_tokens=self.kernels.recurrent_scan_max_tokens,
        )  # fmt: skip
        return self.finish(o, ops), final

    def mix_into_pairs(self, ops: Any, cu_seqlens: torch.Tensor, split: SeamSplit, sink: PairSink) -> torch.Tensor:
        """Isolated segments from zero states -> output; each segment's body pair (``T [HV]``,
        ``S [HV, K, V]``) goes into ``sink``; a segment without a body gets ``(1, 0)``."""
        out, _ = self.mix(ops, cu_seqlens, None)
        _, k, v, g = self.decay_operands(ops)
        idx = split.body_idx
        T, S = decay_ops.decay_pairs(k[idx], v[idx], g[idx], cu_seqlens=split.cu_body, backend=self.backend)
        for j in range(split.n):
            sink.T[j].fill_(1.0)
            sink.S[j].zero_()
        for row, seg in enumerate(split.body_segs):
            sink.T[seg].copy_(T[row])
            sink.S[seg].copy_(S[row])
        return out

    def mix_after_pairs(self, ops: Any, cu_seqlens: torch.Tensor, enter: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Pieces run from ``enter(their own pairs)`` (states ``[P, HV, K, V]``) -> (output, finals)."""
        _, k, v, g = self.decay_operands(ops)
        T, S = decay_ops.decay_pairs(
            k, v, g, cu_seqlens=cu_seqlens, backend=self.backend,
            recurrent_max_tokens=self.kernels.recurrent_scan_max_tokens,
        )  # fmt: skip
        return self.mix(ops, cu_seqlens, enter(T, S))

    def pair_identity(self, like: torch.Tensor) -> torch.Tensor:
        """The transition of an empty span ``[HV]`` (what ``addition`` puts in place of T)."""
        return torch.ones(self.hv, device=like.device, dtype=torch.float32)

    def compose(self, h0: torch.Tensor, T: torch.Tensor, S: torch.Tensor) -> torch.Tensor:
        """States along a chain: h0 ``[HV, K, V]``, T ``[n, HV]``, S ``[n, HV, K, V]`` -> ``[n+1, HV, K, V]``."""
        return decay_ops.decay_chain(h0, T, S)

    def step_slots(self, ops: Any, rec_pool: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """One decode token per row against its pool slot's state (updated in place) -> output."""
        q, k, v, g = self.decay_operands(ops)
        o, new = decay_ops.decay_step(q, k, v, g, rec_pool.index_select(0, slots))
        rec_pool.index_copy_(0, slots, new)
        return self.finish(o, ops)
