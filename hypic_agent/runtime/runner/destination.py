"""``StateDestination``: where a combine forward writes a request's state, its slot and pages in the pool.

A composed (HYPIC) request's state is assembled by the combine forward: per attention layer the
cached bodies' K/V (re-rotated to their positions) and the recomputed active rows, per linear layer
the final recurrent and conv states. With a destination these go straight into the request's share
of the ``StatePool`` instead of into a standalone ``RequestState`` that is copied afterwards:

* attention layers: when positions ``0..length-1`` sit in consecutive pages (``StatePool.alloc``
  prefers such a run), the layer's K/V is *assembled in* the pool: ``kv_buffers`` hands out the
  slices ``pool.k[j].view(-1, Hkv, D)[first : first + length]`` (and ``v``), so nothing is copied.
  Otherwise (a fragmented pool, or activations of another dtype than the pool) they are assembled
  in fresh tensors and ``put`` scatters them into their rows right after the layer: one layer's
  K/V at a time, never the whole prompt's;
* linear layers: ``put`` copies the final states ``[HV, K, V]`` / ``[C, W-1]`` into the slot.

A state built elsewhere (a combine CUDA graph's outputs, in the graph's memory) is written with
``absorb``. ``commit`` then records the sequence's length and tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hypic_agent.runtime.runner.pool import PoolSeq, StatePool
from hypic_agent.runtime.state import AttentionLayerState, LayerState, LinearLayerState, RequestState


@dataclass(frozen=True)
class StateDestination:
    pool: StatePool
    seq: PoolSeq
    length: int  # token rows the combine writes (positions 0..length-1)
    first: int | None  # flat row of position 0 when the rows are one run (in-place K/V), else None
    rows: torch.Tensor  # [length] int64 flat rows on the pool's device (the scatter path)

    @classmethod
    def of(cls, pool: StatePool, seq: PoolSeq, length: int) -> StateDestination:
        """The destination of a ``length``-token state in ``seq`` (raises ``ValueError`` past its pages)."""
        rows = pool.rows(seq, 0, length)
        return cls(pool, seq, length, pool.first_row(seq, length), rows)

    def _layer_rows(self, li: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention layer ``li``'s flat key and value rows ``[R, *k_row]``, ``[R, *v_row]`` (views)."""
        j = self.pool.index[li]
        return self.pool.k[j].view(-1, *self.pool.k.shape[3:]), self.pool.v[j].view(-1, *self.pool.v.shape[3:])

    def kv_buffers(
        self, li: int, k_row: Sequence[int], v_row: Sequence[int], like: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Where attention layer ``li`` assembles its K ``[length, *k_row]`` and V ``[length, *v_row]``:
        the pool's own rows when they are one run of ``like``'s dtype and device, else fresh tensors
        (written by ``put``)."""
        k_rows, v_rows = self._layer_rows(li)
        fits = (
            self.first is not None
            and like.dtype == self.pool.dtype
            and like.device == self.pool.device
            and tuple(k_rows.shape[1:]) == tuple(k_row)
            and tuple(v_rows.shape[1:]) == tuple(v_row)
        )
        if fits:
            assert self.first is not None
            span = slice(self.first, self.first + self.length)
            return k_rows[span], v_rows[span]
        return like.new_empty(self.length, *k_row), like.new_empty(self.length, *v_row)

    def in_place(self, li: int, st: AttentionLayerState) -> bool:
        """Whether ``st`` is attention layer ``li``'s K/V assembled in the pool's rows (``kv_buffers``)."""
        k_rows, _ = self._layer_rows(li)
        return self.first is not None and st.k.data_ptr() == k_rows[self.first].data_ptr()

    def put(self, li: int, st: LayerState) -> None:
        """Write layer ``li``'s state into the slot / pages (K/V assembled in place: nothing to do)."""
        pool = self.pool
        j = pool.index[li]
        if isinstance(st, LinearLayerState):
            pool.recurrent[j, self.seq.slot].copy_(st.recurrent)
            pool.conv[j, self.seq.slot].copy_(st.conv)
            return
        if st.k.shape[0] != self.length:
            raise ValueError(f"layer {li}: {st.k.shape[0]} K/V rows for a destination of {self.length}")
        if self.in_place(li, st):
            return
        k_rows, v_rows = self._layer_rows(li)
        k_rows.index_copy_(0, self.rows, st.k.to(pool.dtype))
        v_rows.index_copy_(0, self.rows, st.v.to(pool.dtype))

    def absorb(self, state: RequestState) -> RequestState:
        """Write every layer of ``state`` (built elsewhere) into the pool; returns it without layers
        (length, a copy of ``last_logits``, tokens): the pool holds them."""
        for li, st in enumerate(state.layers):
            self.put(li, st)
        logits = None if state.last_logits is None else state.last_logits.clone()
        return RequestState([], state.length, logits, list(state.tokens))

    def commit(self, state: RequestState) -> None:
        """Record that ``seq`` now holds ``state``'s tokens (its layers were written here)."""
        if state.length != self.length:
            raise ValueError(f"a state of {state.length} tokens for a destination of {self.length}")
        self.seq.length = state.length
        self.seq.tokens = list(state.tokens)
