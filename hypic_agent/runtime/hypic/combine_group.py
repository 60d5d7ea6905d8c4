"""``CombineGroup``: several composed requests' combines of one step, their linear layers batched.

When k warm requests join one step (a burst), each ``CombineWork`` alone would run, per linear layer,
its own conv, WY factor and chain launches and its own state copies: k times the host work of one
combine for GPU kernels that each fill a fraction of the device. A group runs them once per layer
for all k (``mix_linear``):

* one varlen conv over every request's pieces (``cu`` over the packed active rows, each piece
  entering from its own conv tail: the requests' tails stacked once per step);
* one factor launch over every chunk and one chain launch whose grid runs the k chains side by side
  (``combine_scan.merge_steps``: each request's steps over its own rows, from its own leading state);
* one copy each of the final recurrent and conv states into the requests' slots.

Attention layers rotate every request's active queries and keys in one call each (``mix_attention``);
the rest stays per request (``CombineWork.mix``: each attends over its own spliced K/V in its own pool
rows). The kernels compute every chain over its own rows only, so a request's logits are
those it gets alone (to the kernels' rounding: the chunk size is picked over all the pieces).

A work joins a group when its forward reads every cached tensor by pointer (``CombineInputs.
by_pointer``: the fused Triton scan of a GDN model, splice tables), writes into the pool and has no
blend rows; ``group_works`` keeps the others as they are, in row order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from hypic_agent.kernels import combine_scan
from hypic_agent.kernels.backend import to_device_async
from hypic_agent.runtime.hypic.combine_inputs import CombineInputs
from hypic_agent.runtime.hypic.combine_work import CombineWork
from hypic_agent.runtime.models.layers.decoder import DecoderLayer
from hypic_agent.runtime.models.layers.gated_deltanet import GatedDeltaNet


def groupable(w: CombineWork) -> bool:
    """Whether ``w`` (planned) can run its linear layers in a group (module doc)."""
    inputs = w.inputs
    return (
        isinstance(inputs, CombineInputs)
        and w.into is not None
        and w.lay.blend_rows is None
        and inputs.by_pointer()
        and inputs.tables() is not None
    )


@dataclass
class CombineGroup:
    """Consecutive ``works`` (rows in this order) whose linear layers run batched; ``plan`` once per
    step, then ``mix_linear`` per linear layer."""

    works: list[CombineWork]
    steps: combine_scan.WYSteps | None = field(default=None, init=False, repr=False)
    _cu: torch.Tensor | None = field(default=None, init=False, repr=False)
    _tails: torch.Tensor | None = field(default=None, init=False, repr=False)
    _last_piece: torch.Tensor | None = field(default=None, init=False, repr=False)
    _slots: torch.Tensor | None = field(default=None, init=False, repr=False)
    _zero_h0: torch.Tensor | None = field(default=None, init=False, repr=False)
    _active_pos: torch.Tensor | None = field(default=None, init=False, repr=False)

    @property
    def n_rows(self) -> int:
        return sum(w.n_rows for w in self.works)

    def _inputs(self, w: CombineWork) -> CombineInputs:
        assert isinstance(w.inputs, CombineInputs)
        return w.inputs

    def plan(self) -> None:
        """Merge the works' launch tables (after each ``CombineWork.plan``): steps, piece bounds over the
        packed rows, every piece's entering conv tail, the slots."""
        dev = self.works[0].lay.active_ids.device
        tables: list[combine_scan.ChainTables] = []
        offsets: list[int] = []
        cu: list[int] = [0]
        last: list[int] = []
        tails: list[torch.Tensor] = []
        slots: list[int] = []
        row0 = 0
        for w in self.works:
            tab = self._inputs(w).tables()
            assert tab is not None and w.tails is not None and w.into is not None
            tables.append(tab)
            offsets.append(row0)
            cu += [row0 + b for b in w.lay.cu_host[1:]]
            last.append(len(cu) - 2)
            tails.append(w.tails)
            slots.append(w.into.seq.slot)
            row0 += w.n_rows
        self.steps = combine_scan.merge_steps(tables, offsets, dev)
        self._cu = to_device_async(torch.tensor(cu, dtype=torch.int32), dev)
        self._last_piece = to_device_async(torch.tensor(last, dtype=torch.long), dev)
        self._slots = to_device_async(torch.tensor(slots, dtype=torch.long), dev)
        self._tails = torch.cat(tails, dim=1)  # [L_lin, P_all, C, W-1]
        self._active_pos = torch.cat([w.lay.active_pos for w in self.works])

    def _h0(self, row: int, shape: tuple[int, int, int], device: torch.device) -> torch.Tensor:
        """``[N, HV, K, V]`` fp32: each work's composed leading bodies of linear row ``row``, or zeros."""
        leads = [w.h0 for w in self.works]
        if all(h is None for h in leads):
            if self._zero_h0 is None:
                self._zero_h0 = torch.zeros(len(self.works), *shape, device=device)
            return self._zero_h0
        zero = torch.zeros(shape, device=device)
        return torch.stack([zero if h is None else h[row] for h in leads])

    def mix_linear(self, li: int, mixer: GatedDeltaNet, xs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Linear layer ``li`` over the group's rows of ``mixer_in``'s outputs ``xs`` -> o ``[T, HV, V]``;
        each work's final recurrent and conv states go into its slot (of the pool the works write to)."""
        assert self.steps is not None and self._tails is not None and self._cu is not None
        assert self._slots is not None and self._last_piece is not None
        first = self._inputs(self.works[0])
        row = first.lin_row[li]
        tab = first.tables()
        assert tab is not None
        mixed, z, g, beta = xs[:4]  # GDN's ``inputs``
        ops, conv_final = mixer.convolve(mixed, z, g, beta, self._cu, self._tails[row].to(mixed.dtype))
        h0 = self._h0(row, (mixer.hv, mixer.dk, mixer.dv), mixed.device)
        o, finals = mixer.mix_scan_merged(
            ops, self.steps, row, h0, pair_dtype=tab.pair_dtype,
            transition=self.works[0].spec.transition, precise_for_half=first.kernels.precise_for_half,
        )  # fmt: skip
        into = self.works[0].into
        assert into is not None
        pool = into.pool
        j = pool.index[li]
        pool.recurrent[j].index_copy_(0, self._slots, finals.to(pool.recurrent.dtype))
        pool.conv[j].index_copy_(0, self._slots, conv_final.index_select(0, self._last_piece).to(pool.conv.dtype))
        return o

    def mix_attention(self, li: int, layer: DecoderLayer, xs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
        """Attention layer ``li`` over the group's rows: q and k of all of them rotated at once, then each
        work's own splice and attention -> each work's o ``[Ta, Hq, D]``, in order."""
        assert layer.self_attn is not None and self._active_pos is not None
        attn = layer.self_attn
        q, k = attn.rotate(xs[0], self._active_pos), attn.rotate(xs[1], self._active_pos)
        outs = []
        a = 0
        for w in self.works:
            b = a + w.n_rows
            mine = tuple(x[a:b] for x in (q, k, *xs[2:]))
            outs.append(w.mix(li, layer, mine, rotated=True))
            a = b
        return outs


def group_works(works: Sequence[CombineWork]) -> list[CombineWork | CombineGroup]:
    """The step's planned combines in row order, runs of two or more groupable works with the same
    mode, kernel choices, pair dtype and pool as one ``CombineGroup`` each (planned), the others alone."""
    out: list[CombineWork | CombineGroup] = []
    run: list[CombineWork] = []

    def key(w: CombineWork) -> tuple[object, ...]:
        assert isinstance(w.inputs, CombineInputs)
        tab = w.inputs.tables()
        pool = None if w.into is None else w.into.pool
        return (w.spec.transition, w.inputs.kernels, None if tab is None else tab.pair_dtype, id(pool))

    def flush() -> None:
        if len(run) >= 2:
            group = CombineGroup(list(run))
            group.plan()
            out.append(group)
        else:
            out.extend(run)
        run.clear()

    for w in works:
        if groupable(w) and (not run or key(w) == key(run[0])):
            run.append(w)
            continue
        flush()
        if groupable(w):
            run.append(w)
        else:
            out.append(w)
    flush()
    return out
