"""``StatePool``: every running request's decode state, preallocated at start-up.

Linear layers keep a fixed-size state per request, attention layers a KV that grows by one row
per token. Both live in tensors allocated once, so decoding allocates nothing and updates in place:

* linear layers: ``recurrent [L_lin, S+1, HV, K, V]`` fp32 and ``conv [L_lin, S+1, C, W-1]``, one
  *slot* per request (as SGLang's MambaPool);
* attention layers: ``k, v [L_attn, P+1, page_size, Hkv, D]``, pages of ``page_size`` token rows;
  a request holds a list of pages (its block table), keys stored rotated at their positions. MLA
  layers page their latent form instead (``HybridConfig.attention_cache_rows``): ``k`` the rotated
  rope key ``[.., 1, rope]``, ``v`` the latent ``[.., 1, kv_lora_rank]``.

Slot 0 and page 0 are scratch: the padding rows of a CUDA-graph batch point there, so a padded
step never touches a live request's state. A request reserves the pages for its whole prompt and
``max_tokens`` when it is admitted: decoding can never run out of pages, so nothing is preempted
or corrupted when the pool is full (the scheduler queues the next request instead).

Block tables: beside each ``PoolSeq``'s host list of pages, ``block_table [S+1, max_seq_pages]``
(int32, on the pool's device) holds each slot's pages, zero-padded, written once when the slot is
allocated (a request's pages never change while it holds the slot); slot 0's row stays zero. A
decode plan gathers its rows by slot on the device (``plan._decode_plan``), so a decode step's
host work per request is O(1) whatever the context length. A sequence longer than
``max_seq_pages`` widens the table (rare: the scheduler never admits one).

Pages are refcounted: a request's block table holds one reference to each of its pages, and the
prefix cache (``radix_cache.RadixCache``) one more to each page it keeps; a page is free when
nothing references it. A request that resumes a cached prefix starts its block table with those
pages (``alloc(tokens, shared=...)``: shared, not copied). Snapshots: ``snap_recurrent
[L_lin, N, HV, K, V]`` and ``snap_conv [L_lin, N, C, W-1]`` keep a slot's linear state at a cached
prefix's end (``save_snapshot`` / ``load_snapshot``, or written by the forward that passes that end:
``take_snapshot``); the attention KV of that prefix is its pages.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from hypic_agent.runtime.models.config import HybridConfig
from hypic_agent.runtime.runner.upload import upload
from hypic_agent.runtime.state import AttentionLayerState, LayerState, LinearLayerState, RequestState


@dataclass
class PoolSeq:
    """One request's share of the pool: its slot, its pages, the tokens its state holds."""

    slot: int
    pages: list[int]
    capacity: int  # tokens the pages hold
    length: int = 0  # tokens whose state is in the pool
    tokens: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class PoolUsage:
    slots_used: int
    slots_total: int
    pages_used: int
    pages_total: int
    page_size: int
    bytes_total: int
    snapshots_used: int = 0
    snapshots_total: int = 0


class StatePool:
    def __init__(
        self,
        cfg: HybridConfig,
        *,
        slots: int,
        kv_tokens: int,
        page_size: int,
        device: torch.device,
        dtype: torch.dtype,
        max_seq_tokens: int | None = None,
        snapshots: int = 0,
    ) -> None:
        """``snapshots``: linear-state snapshot rows for the prefix cache (0: it keeps nothing)."""
        if snapshots < 0:
            raise ValueError(f"snapshots must be >= 0, got {snapshots}")
        if slots < 1 or page_size < 1 or kv_tokens < page_size:
            raise ValueError(f"pool needs slots >= 1 and kv_tokens >= page_size, got {slots}, {kv_tokens}, {page_size}")
        self.cfg = cfg
        self.page_size = page_size
        self.device = device
        self.dtype = dtype
        kinds = cfg.layer_types
        self.linear_layers = [i for i, k in enumerate(kinds) if k == "linear"]
        self.attention_layers = [i for i, k in enumerate(kinds) if k != "linear"]
        self.index = {li: j for j, li in enumerate(self.linear_layers)} | {
            li: j for j, li in enumerate(self.attention_layers)
        }
        self.n_slots = slots
        self.n_pages = -(-kv_tokens // page_size)
        # the longest sequence (prompt + max_tokens, bounded by the context window): block-table width
        self.max_seq_pages = min(self.n_pages, -(-(max_seq_tokens or kv_tokens) // page_size))
        n_lin, n_att = len(self.linear_layers), len(self.attention_layers)
        c, w = cfg.linear_conv_dim, cfg.linear_conv_kernel_dim
        # [HV, K, V] per slot for every linear kind ([0, 0, 0] for short conv: the conv is the state)
        self.recurrent = torch.zeros(n_lin, slots + 1, *cfg.linear_state_shape, device=device, dtype=torch.float32)
        self.conv = torch.zeros(n_lin, slots + 1, c, max(w - 1, 0), device=device, dtype=dtype)
        k_row, v_row = cfg.attention_cache_rows
        self.k = torch.zeros(n_att, self.n_pages + 1, page_size, *k_row, device=device, dtype=dtype)
        self.v = torch.zeros(n_att, self.n_pages + 1, page_size, *v_row, device=device, dtype=dtype)
        self.n_snapshots = snapshots
        # prefix-cache snapshots of a slot's linear state: [L_lin, N, HV, K, V] and [L_lin, N, C, W-1]
        self.snap_recurrent = torch.zeros(n_lin, snapshots, *cfg.linear_state_shape, device=device, dtype=torch.float32)
        self.snap_conv = torch.zeros(n_lin, snapshots, c, max(w - 1, 0), device=device, dtype=dtype)
        # each slot's pages (zero-padded; slot 0 scratch, all zeros): what decode plans gather by slot
        self.block_table = torch.zeros(slots + 1, self.max_seq_pages, dtype=torch.int32, device=device)
        self._free_slots = list(range(slots, 0, -1))  # pop() hands out low numbers first
        self._free_snaps = list(range(snapshots - 1, -1, -1))
        self._page_free = torch.ones(self.n_pages + 1, dtype=torch.bool)  # host mask; page 0 is scratch
        self._page_free[0] = False
        self._refs = torch.zeros(self.n_pages + 1, dtype=torch.int32)  # host: references to each page
        self._n_free_pages = self.n_pages
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ sizes
    def pages_for(self, tokens: int) -> int:
        return -(-max(tokens, 1) // self.page_size)

    def fits_ever(self, tokens: int) -> bool:
        """Whether a request of ``tokens`` (prompt + max_tokens) could be admitted into an empty pool."""
        return self.pages_for(tokens) <= self.max_seq_pages

    @property
    def free_pages(self) -> int:
        return self._n_free_pages

    @property
    def free_slots(self) -> int:
        return len(self._free_slots)

    def refs(self, page: int) -> int:
        """How many block tables and prefix-cache nodes reference ``page`` (0: free)."""
        return int(self._refs[page])

    def usage(self) -> PoolUsage:
        with self._lock:
            tensors = (self.recurrent, self.conv, self.k, self.v, self.snap_recurrent, self.snap_conv)
            return PoolUsage(
                self.n_slots - len(self._free_slots),
                self.n_slots,
                self.n_pages - self._n_free_pages,
                self.n_pages,
                self.page_size,
                sum(t.nbytes for t in tensors),
                self.n_snapshots - len(self._free_snaps),
                self.n_snapshots,
            )

    # ------------------------------------------------------------------ alloc / free
    def alloc(self, tokens: int, shared: Sequence[int] = ()) -> PoolSeq | None:
        """A slot and the pages for ``tokens`` rows, zeroed linear state; None when they are not free.
        ``shared``: pages already in use (a cached prefix's) that begin the block table, referenced
        once more instead of taken; only the rest are new. The new pages are the lowest run of
        consecutive free pages where there is one (a combine then assembles each attention layer's
        K/V in place: ``StateDestination``), else the lowest free."""
        total = self.pages_for(tokens)
        need = total - len(shared)
        if need < 0:
            raise ValueError(f"{len(shared)} shared pages exceed the {total} pages of {tokens} tokens")
        with self._lock:
            if not self._free_slots or need > self._n_free_pages:
                return None
            if shared and bool((self._refs[list(shared)] <= 0).any()):
                raise ValueError("shared pages must be in use")
            slot = self._free_slots.pop()
            self._add_refs(shared, 1)
            pages = list(shared) + self._take_pages(need)
        self.recurrent[:, slot].zero_()
        self.conv[:, slot].zero_()
        self._write_table(slot, pages)
        return PoolSeq(slot, pages, total * self.page_size)

    def _write_table(self, slot: int, pages: list[int]) -> None:
        """``slot``'s row of ``block_table``: ``pages``, then zeros (one host-to-device copy)."""
        if len(pages) > self.block_table.shape[1]:  # longer than the longest sequence: widen
            wide = torch.zeros(self.n_slots + 1, len(pages), dtype=torch.int32, device=self.device)
            wide[:, : self.block_table.shape[1]] = self.block_table
            self.block_table = wide
        row = torch.zeros(self.block_table.shape[1], dtype=torch.int32)
        row[: len(pages)] = torch.tensor(pages, dtype=torch.int32)
        self.block_table[slot].copy_(upload(row, self.device))

    def _take_pages(self, need: int) -> list[int]:
        """Mark ``need`` free pages used (caller holds the lock): the first run of ``need`` consecutive
        free pages, or the lowest free pages when no run is that long."""
        if need == 0:
            return []
        free = self._page_free
        counts = torch.cumsum(free, 0)  # [n_pages + 1]: free pages among 0..i
        window = counts[need:] - counts[:-need]  # [m]: free pages among m+1..m+need
        run = torch.nonzero(window == need)
        if run.numel():
            first = int(run[0, 0]) + 1
            pages = list(range(first, first + need))
        else:
            pages = torch.nonzero(free).flatten()[:need].tolist()
        free[pages] = False
        self._refs[pages] = 1
        self._n_free_pages -= need
        return pages

    def _add_refs(self, pages: Sequence[int], delta: int) -> int:
        """Add ``delta`` to each page's count (caller holds the lock); returns how many pages became
        free (count 0), which go back to the free list."""
        if not pages:
            return 0
        if 0 in pages:
            raise ValueError("page 0 is scratch: it is never referenced")
        idx = torch.tensor(list(pages), dtype=torch.int64)
        self._refs.index_add_(0, idx, torch.full((len(idx),), delta, dtype=torch.int32))
        if delta > 0:
            return 0
        counts = self._refs[idx]
        if bool((counts < 0).any()):
            raise RuntimeError(f"page references went negative: {pages}")
        freed = idx[counts == 0].unique()
        self._page_free[freed] = True
        self._n_free_pages += int(freed.numel())
        return int(freed.numel())

    def share(self, pages: Sequence[int]) -> None:
        """One more reference to each of ``pages`` (in use already): the prefix cache keeps them."""
        with self._lock:
            if pages and bool((self._refs[list(pages)] <= 0).any()):
                raise ValueError("only pages in use can be shared")
            self._add_refs(pages, 1)

    def release(self, pages: Sequence[int]) -> int:
        """Drop one reference to each of ``pages``; returns how many became free."""
        with self._lock:
            return self._add_refs(pages, -1)

    def free(self, seq: PoolSeq) -> None:
        """Give back ``seq``'s slot and its references to its pages (a page still referenced by the
        prefix cache or another request stays in use)."""
        with self._lock:
            if seq.slot:
                self._free_slots.append(seq.slot)
            self._add_refs(seq.pages, -1)
        seq.slot, seq.pages, seq.capacity = 0, [], 0

    # ------------------------------------------------------------------ prefix-cache snapshots
    def take_snapshot(self) -> int | None:
        """A free snapshot row, reserved and not yet written (a forward fills it: a prefill row split
        at a prefix boundary, ``plan.RowSnapshot``); None when every row is taken."""
        with self._lock:
            return self._free_snaps.pop() if self._free_snaps else None

    def save_snapshot(self, slot: int) -> int | None:
        """A free snapshot row holding a copy of ``slot``'s linear state (recurrent + conv of every
        linear layer); None when every row is taken."""
        snap = self.take_snapshot()
        if snap is None:
            return None
        self.snap_recurrent[:, snap].copy_(self.recurrent[:, slot])
        self.snap_conv[:, snap].copy_(self.conv[:, slot])
        return snap

    def load_snapshot(self, snap: int, slot: int) -> None:
        """Copy snapshot ``snap`` into ``slot``'s linear state."""
        self.recurrent[:, slot].copy_(self.snap_recurrent[:, snap])
        self.conv[:, slot].copy_(self.snap_conv[:, snap])

    def drop_snapshot(self, snap: int) -> None:
        with self._lock:
            if snap in self._free_snaps or not 0 <= snap < self.n_snapshots:
                raise ValueError(f"snapshot {snap} is not taken")
            self._free_snaps.append(snap)

    def copy_page(self, src: int, dst: int) -> None:
        """Every attention layer's rows of page ``src`` into page ``dst`` (copy-on-write of a cached
        prefix's partial last page)."""
        self.k[:, dst].copy_(self.k[:, src])
        self.v[:, dst].copy_(self.v[:, src])

    def first_row(self, seq: PoolSeq, length: int) -> int | None:
        """The flat row of position 0 when positions ``0..length-1`` of ``seq`` sit in consecutive
        pages (one slice of a layer's ``k.view(-1, Hkv, D)`` holds them), else None."""
        n = self.pages_for(length)
        first = seq.pages[0] if seq.pages else 0
        if n > len(seq.pages) or seq.pages[:n] != list(range(first, first + n)):
            return None
        return first * self.page_size

    # ------------------------------------------------------------------ addressing
    def rows(self, seq: PoolSeq, start: int, end: int) -> torch.Tensor:
        """Flat row indices ``[end - start]`` (int64, on the pool's device) of token positions
        ``start..end-1`` of ``seq`` in a layer's ``k.view(-1, Hkv, D)``."""
        if end > seq.capacity:
            raise ValueError(f"positions up to {end} exceed the sequence's reserved {seq.capacity} tokens")
        pos = torch.arange(start, end)
        pages = torch.tensor(seq.pages, dtype=torch.int64)[pos // self.page_size]
        return upload(pages * self.page_size + pos % self.page_size, self.device)

    # ------------------------------------------------------------------ load / export
    def load(self, seq: PoolSeq, state: RequestState) -> None:
        """Copy a request state built outside the pool (combine, prefix cache) into ``seq``."""
        if state.length > seq.capacity:
            raise ValueError(f"state of {state.length} tokens exceeds the sequence's {seq.capacity}")
        rows = self.rows(seq, 0, state.length) if state.length else None
        for li, st in enumerate(state.layers):
            j = self.index[li]
            if isinstance(st, LinearLayerState):
                self.recurrent[j, seq.slot].copy_(st.recurrent)
                self.conv[j, seq.slot].copy_(st.conv)
            elif rows is not None:
                self.k[j].view(-1, *self.k.shape[3:]).index_copy_(0, rows, st.k.to(self.dtype))
                self.v[j].view(-1, *self.v.shape[3:]).index_copy_(0, rows, st.v.to(self.dtype))
        seq.length = state.length
        seq.tokens = list(state.tokens)

    def export(self, seq: PoolSeq) -> RequestState:
        """A standalone copy of ``seq``'s state (for the prefix cache)."""
        rows = self.rows(seq, 0, seq.length)
        layers: list[LayerState] = []
        for li in range(len(self.cfg.layer_types)):
            j = self.index[li]
            if li in self.linear_layers:
                layers.append(LinearLayerState(self.recurrent[j, seq.slot].clone(), self.conv[j, seq.slot].clone()))
            else:
                k = self.k[j].view(-1, *self.k.shape[3:]).index_select(0, rows)
                v = self.v[j].view(-1, *self.v.shape[3:]).index_select(0, rows)
                layers.append(AttentionLayerState(k, v))
        return RequestState(layers, seq.length, None, list(seq.tokens))
