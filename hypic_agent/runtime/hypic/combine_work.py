"""``CombineWork``: one composed request's combine as rows of a forward.

A composed (HYPIC) request is prepared by a forward over its *active* tokens only (seam windows,
blend rows, the suffix; ``CombineLayout``) on top of its cached entries. In the model runner's
layer loop (``runner.layer_loop``) such work is one row group among others (decode tokens, prefill
chunks, other requests' combines, cold builds): every token-local stage runs once over all rows,
and per layer this object runs the request's own mixer work on its rows:

* linear layers: the chain piece -> cached body pair -> piece (``combine_linear``);
* attention layers: the active queries over the spliced K/V of the whole prompt
  (``combine_attention``), assembled in the request's pool rows when it has a destination.

Each layer's state goes into the request's slot and pages as the layer runs (``into``:
``StateDestination``) or, without one (a standalone prepare, a captured CUDA graph), into
``layers``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from hypic_agent.runtime.hypic.combine_attention import combine_attention
from hypic_agent.runtime.hypic.combine_inputs import CombineInputs
from hypic_agent.runtime.hypic.combine_linear import combine_linear
from hypic_agent.runtime.hypic.entry import SegmentEntry
from hypic_agent.runtime.hypic.layout import CombineLayout
from hypic_agent.runtime.hypic.modes import ModeSpec
from hypic_agent.runtime.models.layers.decoder import DecoderLayer
from hypic_agent.runtime.runner.destination import StateDestination
from hypic_agent.runtime.state import LayerState, RequestState


@dataclass
class CombineWork:
    """``lay``'s active rows over ``entries`` in mode ``spec``. ``inputs``: the planned scan tables,
    leading bodies and splice (``combine_inputs``), or a function that plans them, called once the
    forward's first layer is queued (a cold request's tables take host time the GPU need not wait
    for). ``into``: where the state goes (None: ``layers``)."""

    lay: CombineLayout
    entries: list[SegmentEntry | None]
    spec: ModeSpec
    inputs: CombineInputs | Callable[[], CombineInputs]
    into: StateDestination | None = None
    layers: list[LayerState] = field(default_factory=list)
    _h0: torch.Tensor | None = field(default=None, init=False, repr=False)
    _tails: torch.Tensor | None = field(default=None, init=False, repr=False)
    _rows: dict[int, int] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.into is not None and self.into.length != self.lay.total:
            raise ValueError(f"a combine of {self.lay.total} tokens into a destination of {self.into.length}")

    @property
    def n_rows(self) -> int:
        """Active rows ``Ta`` this work adds to the forward."""
        return int(self.lay.active_ids.shape[0])

    @property
    def planned(self) -> CombineInputs | None:
        return self.inputs if isinstance(self.inputs, CombineInputs) else None

    @property
    def tails(self) -> torch.Tensor | None:
        """After ``plan``: the conv states entering every piece of every linear layer ``[L_lin, P, C, W-1]``
        (None: read from the entries, without splice tables)."""
        return self._tails

    @property
    def h0(self) -> torch.Tensor | None:
        """After ``plan``: the composed leading bodies per linear layer ``[L_lin, HV, K, V]`` (None: none)."""
        return self._h0

    def plan(self) -> None:
        """Plan the inputs (if given as a function) and compose the leading bodies: before layer 0's
        mixer work."""
        if not isinstance(self.inputs, CombineInputs):
            self.inputs = self.inputs()
        inputs = self.inputs
        self._h0 = inputs.lead.compose() if inputs.lead is not None else None
        self._tails = inputs.splice.conv_tails() if inputs.splice is not None else None
        self._rows = inputs.lin_row

    def mix(self, li: int, layer: DecoderLayer, xs: tuple[torch.Tensor, ...], rotated: bool = False) -> torch.Tensor:
        """Layer ``li``'s mixer over this work's rows of ``mixer_in``'s outputs ``xs`` -> o (before the
        output projection: GDN ``[Ta, HV, V]``, attention ``[Ta, Hq, D]``); the layer's state is
        written into the destination (or kept in ``layers``). ``rotated``: an attention layer's q and k
        come rotated to their positions already (``combine_attention``)."""
        inputs = self.inputs
        assert isinstance(inputs, CombineInputs), "plan() first"
        st: LayerState
        if layer.linear_attn is not None:
            row = self._rows[li]
            o, st = combine_linear(
                layer.linear_attn, xs, self.lay, self.entries, li, self.spec, inputs.plan[li],
                None if self._tails is None else self._tails[row], None if self._h0 is None else self._h0[row],
                inputs.kernels,
            )  # fmt: skip
        else:
            assert layer.self_attn is not None
            q, k, v = xs[:3]
            o, st = combine_attention(
                layer.self_attn, q, k, v, self.lay, self.entries, li, self.spec, inputs.splice, self.into, rotated
            )
        if self.into is None:
            self.layers.append(st)
        else:  # in the pool already (K/V assembled in place) or written there now
            self.into.put(li, st)
        return o

    def state(self, logits: torch.Tensor) -> RequestState:
        """The request's state after the forward (``logits [vocab]`` of its last active row); without
        layers when they went into the pool."""
        return RequestState(self.layers, self.lay.total, logits, tokens=list(self.lay.tokens))
