"""``LinearMixer``: what the runtime's layer loops ask of a fixed-state (linear) layer's mixer.

Kinds implementing it: ``GatedDeltaNet`` (``gdn``: dense ``T [HV, K, K]`` pairs), ``Mamba2Mixer``
(``mamba2``: decay-only, ``T [HV]``) and ``ShortConv`` (``short_conv``: the conv tail is the whole
state, no pair). Every kind has a causal conv (``conv_dim`` channels, kernel ``kernel``) and a
recurrent state ``[HV, K, V]`` per sequence (``[0, 0, 0]`` for ``short_conv``), so the state pool,
``RequestState`` and ``SegmentEntry`` keep one layout. The loops (``runner/mixers.py``,
``forward.py``, ``hypic/build.py``, ``hypic/combine.py``) call these stages; what only GDN has (its
fused combine scan, its CUDA-graph cold core, its Triton decode kernel) is chosen on ``kind``.

Conventions: ``inputs(x)`` is token-local and its second element is what ``output`` takes besides
the mixer output (``DecoderLayer.mixer_out``'s ``extra``); ``convolve(*inputs, cu_seqlens,
conv_state)`` gives the operands and the final conv states ``[N, C, W-1]``.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from hypic_agent.kernels.gdn_pairs import PairSink, SeamSplit


class LinearMixer(Protocol):
    kind: str  # "gdn" | "mamba2" | "short_conv"
    hv: int
    dk: int
    dv: int
    conv_dim: int
    kernel: int
    backend: str

    def inputs(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]: ...

    def convolve(self, *args: Any) -> tuple[Any, torch.Tensor]: ...

    def mix(
        self, ops: Any, cu_seqlens: torch.Tensor | None, initial_state: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def mix_into_pairs(self, ops: Any, cu_seqlens: torch.Tensor, split: SeamSplit, sink: PairSink) -> torch.Tensor: ...

    def mix_after_pairs(self, ops: Any, cu_seqlens: torch.Tensor, enter: Any) -> tuple[torch.Tensor, torch.Tensor]: ...

    def pair_identity(self, like: torch.Tensor) -> torch.Tensor: ...

    def compose(self, h0: torch.Tensor, T: torch.Tensor, S: torch.Tensor) -> torch.Tensor: ...

    def output(self, o: torch.Tensor, extra: torch.Tensor) -> torch.Tensor: ...

    def step(
        self, x: torch.Tensor, state: torch.Tensor, conv_state: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...

    def decode_slots(
        self, inputs: tuple[torch.Tensor, ...], conv_pool: torch.Tensor, rec_pool: torch.Tensor, slots: torch.Tensor
    ) -> torch.Tensor: ...


def at(mixer: Any, positions: torch.Tensor) -> dict[str, torch.Tensor]:
    """Keyword arguments for ``convolve`` / ``step`` / ``decode_slots``: the rows' positions ``[T]`` for a
    mixer that rotates inside (``positional``: Ring-linear's ``lightning_rope``), nothing for the others."""
    return {"positions": positions} if getattr(mixer, "positional", False) else {}
