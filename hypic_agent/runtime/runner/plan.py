"""``ForwardPlan``: one forward's work, immutable, with every index it needs already on the device.

A plan's *pool rows* are N sequences of the state pool, each extended by its new tokens: a decode
row is one token, a prefill chunk many. Token-packed ("varlen") like the rest of the runtime: rows
``[T]`` with ``cu_seqlens [N+1]``. Beside them the same forward may carry HYPIC work: composed
requests' combines (``combines``: ``hypic.combine_work.CombineWork``, their active rows over cached
entries, written into their own slots and pages) and cold segment builds (``colds``:
``hypic.build.ColdBatch``, isolated prefills whose pairs and K/V are captured into entries). Built
once on the host per step (``plan_forward``), read by every layer (``layer_loop``).

A prefill row may also pass a ``prefix_cache`` boundary (``RowSnapshot``): its linear mixers then
run in two parts (``LinearSplit``), the state between them written into a reserved snapshot row of
the pool, so the boundary costs no forward of its own (the rest of the layer runs once over all rows).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from hypic_agent.kernels._varlen import cu_seqlens as _cu
from hypic_agent.runtime.runner.pool import PoolSeq, StatePool
from hypic_agent.runtime.runner.upload import upload

if TYPE_CHECKING:
    from hypic_agent.runtime.hypic.build import ColdBatch
    from hypic_agent.runtime.hypic.combine_work import CombineWork


@dataclass(frozen=True)
class RowSnapshot:
    """Pool row ``row``'s linear state after its first ``offset`` new tokens goes into the pool's
    snapshot row ``snapshot`` (``StatePool.take_snapshot``; ``0 < offset < len(row's tokens)``)."""

    row: int
    offset: int
    snapshot: int


@dataclass(frozen=True)
class LinearSplit:
    """The linear mixers' two parts of a plan with ``RowSnapshot``s (device tensors): part 1 every
    row up to its split (whole rows unsplit), part 2 the split rows' rest, from part 1's states."""

    first: torch.Tensor  # [T1] int64 pool-row tokens of part 1
    cu_first: torch.Tensor  # [N+1] int32 its bounds (one sequence per pool row)
    rest: torch.Tensor  # [T2] int64 tokens of part 2
    cu_rest: torch.Tensor  # [S+1] int32 its bounds (one sequence per split row)
    split_rows: torch.Tensor  # [S] int64 pool row of each split
    snapshots: torch.Tensor  # [S] int64 snapshot row each split's part-1 state goes to
    # T1 when part 1 is the tokens ``[0, T1)`` and part 2 ``[T1, T)`` (one split, in the plan's last row:
    # the usual prefix-cache step), so the mixers slice instead of gathering and scattering: None otherwise
    cut: int | None = None


@dataclass(frozen=True)
class PagedRows:
    """A paged plan (``plan_forward(paged=True)``) mixing one-token rows with longer ones: the
    one-token (decode) rows attend through the block table (the paged kernel, as a decode-only
    step does); only the longer rows' sequences gather their keys (the plan's ``key_rows`` and
    ``cu_keys_host`` hold those sequences only), so a step that joins prefill or HYPIC work to many
    long decodes does not copy every decode's whole context per attention layer."""

    decode_tok: torch.Tensor  # [Nd] int64 token row of each one-token sequence
    decode_seq: torch.Tensor  # [Nd] int64 its sequence (row of block_table / context_lens)
    extend_tok: torch.Tensor  # [Te] int64 token rows of the longer sequences, in order
    cu_extend_host: torch.Tensor  # [Ne+1] int32 (host) their bounds within extend_tok


@dataclass(frozen=True)
class ForwardPlan:
    seqs: tuple[PoolSeq, ...]
    new_tokens: tuple[tuple[int, ...], ...]
    decode_only: bool  # every sequence gets exactly one token
    ids: torch.Tensor  # [T] int64 token ids
    positions: torch.Tensor  # [T] int64 position of each row in its sequence
    slots: torch.Tensor  # [N] int64 linear-state slot of each sequence
    rows: torch.Tensor  # [T] int64 flat KV row (page * page_size + offset) each new token is written to
    cu_seqlens: torch.Tensor  # [N+1] int32 (device) new tokens per sequence
    cu_host: torch.Tensor  # [N+1] int32 (host) the same bounds
    key_rows: torch.Tensor  # [sum of context lengths] int64 flat KV rows each sequence attends over
    cu_keys_host: torch.Tensor  # [N+1] int32 (host) bounds of key_rows per sequence
    block_table: torch.Tensor  # [N, max pages] int32 (decode attention)
    context_lens: torch.Tensor  # [N] int32 keys visible to each sequence's last token
    last_rows: torch.Tensor  # [N] int64 row of each sequence's last new token (its logits)
    combines: tuple[CombineWork, ...] = ()  # composed requests' combines (rows after the pool rows)
    colds: tuple[ColdBatch, ...] = ()  # cold segment builds (rows before the pool rows)
    split: LinearSplit | None = None  # pool rows passing a prefix boundary (``RowSnapshot``)
    paged_rows: PagedRows | None = None  # paged decode rows beside longer ones (``PagedRows``)

    @property
    def n_tokens(self) -> int:
        """Pool rows."""
        return int(self.ids.shape[0])

    @property
    def pool_only(self) -> bool:
        """No HYPIC work: pool rows only (a decode-only such plan replays from the decode graphs)."""
        return not self.combines and not self.colds

    @property
    def n_rows(self) -> int:
        """Every row of the forward: cold builds, pool rows, combines."""
        return sum(c.n_tokens for c in self.colds) + self.n_tokens + sum(w.n_rows for w in self.combines)


def plan_forward(
    pool: StatePool | None,
    seqs: Sequence[PoolSeq],
    new_tokens: Sequence[Sequence[int]],
    *,
    paged: bool = False,
    combines: Sequence[CombineWork] = (),
    colds: Sequence[ColdBatch] = (),
    snapshots: Sequence[RowSnapshot] = (),
    device: torch.device | None = None,
) -> ForwardPlan:
    """The plan extending ``seqs[i]`` by ``new_tokens[i]`` (each non-empty, within its reserved pages),
    with ``combines`` and ``colds`` in the same forward, and the linear states of ``snapshots``
    written on the way. ``paged``: decode pool rows attend through
    the block table (paged attention), so the per-key gather rows (``key_rows``, the bulk of a long
    context's plan) are not built. Without sequences (HYPIC work only) ``pool`` may be None and
    ``device`` says where the plan's tensors go."""
    if len(seqs) != len(new_tokens) or any(len(t) == 0 for t in new_tokens):
        raise ValueError("a forward plan needs one non-empty token list per sequence")
    if not seqs and not combines and not colds:
        raise ValueError("an empty forward plan")
    if not seqs:
        dev = device if device is not None else pool.device if pool is not None else torch.device("cpu")
        return _no_pool_rows(dev, tuple(combines), tuple(colds))
    assert pool is not None, "pool rows need the state pool"
    plan = _pool_rows(pool, seqs, new_tokens, paged)
    if combines or colds:
        plan = dataclasses.replace(plan, combines=tuple(combines), colds=tuple(colds))
    if snapshots:
        plan = dataclasses.replace(plan, split=_linear_split(pool.device, plan.new_tokens, snapshots))
    return plan


def _linear_split(
    device: torch.device, toks: tuple[tuple[int, ...], ...], snapshots: Sequence[RowSnapshot]
) -> LinearSplit:
    at = {s.row: s.offset for s in snapshots}
    if len(at) != len(snapshots):
        raise ValueError("one snapshot per pool row at most")
    for s in snapshots:
        if not 0 <= s.row < len(toks) or not 0 < s.offset < len(toks[s.row]):
            raise ValueError(f"snapshot offset {s.offset} is not inside pool row {s.row}")
    first: list[int] = []
    rest: list[int] = []
    first_lens: list[int] = []
    a = 0
    for i, t in enumerate(toks):
        cut = at.get(i, len(t))
        first += range(a, a + cut)
        rest += range(a + cut, a + len(t))
        first_lens.append(cut)
        a += len(t)
    ordered = sorted(snapshots, key=lambda s: s.row)
    rest_lens = [len(toks[s.row]) - s.offset for s in ordered]
    longs = [
        torch.tensor(x, dtype=torch.int64)
        for x in (first, rest, [s.row for s in ordered], [s.snapshot for s in ordered])
    ]
    (f, r, rows, snaps), (cu_f, cu_r) = _upload_by_dtype(device, longs, [_cu(first_lens), _cu(rest_lens)])
    contiguous = len(ordered) == 1 and ordered[0].row == len(toks) - 1
    return LinearSplit(f, cu_f, r, cu_r, rows, snaps, len(first) if contiguous else None)


def _no_pool_rows(dev: torch.device, combines: tuple[CombineWork, ...], colds: tuple[ColdBatch, ...]) -> ForwardPlan:
    """A plan of HYPIC work only (no pool rows). Nothing is copied from the host: a combine's CUDA
    graph (``combine_graphs``) captures the forward this plan is made in."""
    longs = torch.zeros(0, dtype=torch.int64, device=dev)
    cu = torch.zeros(1, dtype=torch.int32)
    return ForwardPlan(
        seqs=(),
        new_tokens=(),
        decode_only=False,
        ids=longs,
        positions=longs,
        slots=longs,
        rows=longs,
        cu_seqlens=torch.zeros(1, dtype=torch.int32, device=dev),
        cu_host=cu,
        key_rows=longs,
        cu_keys_host=cu,
        block_table=torch.zeros(0, 0, dtype=torch.int32, device=dev),
        context_lens=torch.zeros(0, dtype=torch.int32, device=dev),
        last_rows=longs,
        combines=combines,
        colds=colds,
    )


def _pool_rows(
    pool: StatePool, seqs: Sequence[PoolSeq], new_tokens: Sequence[Sequence[int]], paged: bool
) -> ForwardPlan:
    if paged and all(len(t) == 1 for t in new_tokens):
        return _decode_plan(pool, seqs, tuple((int(t[0]),) for t in new_tokens))
    toks = tuple(tuple(int(t) for t in ts) for ts in new_tokens)
    lens = [len(t) for t in toks]
    ctx = _context_lengths(seqs, lens)
    ps = pool.page_size
    pos = torch.cat([torch.arange(s.length, c) for s, c in zip(seqs, ctx, strict=True)])
    owner = torch.repeat_interleave(torch.arange(len(seqs)), torch.tensor(lens))
    # paged: one-token rows attend through the block table, only the longer ones gather keys (and only
    # their pages are laid out on the host: the one-token rows' block table is the pool's, on the device)
    one = [i for i, n in enumerate(lens) if n == 1] if paged else []
    gather = [i for i, n in enumerate(lens) if n > 1] if one else list(range(len(seqs)))
    key_ctx = [ctx[i] for i in gather]
    table = torch.zeros(len(gather), max(len(seqs[i].pages) for i in gather), dtype=torch.int64)
    for j, i in enumerate(gather):
        table[j, : len(seqs[i].pages)] = torch.tensor(seqs[i].pages, dtype=torch.int64)
    key_pos = torch.cat([torch.arange(0, c) for c in key_ctx])
    key_owner = torch.repeat_interleave(torch.arange(len(gather)), torch.tensor(key_ctx))
    key_rows = table[key_owner, key_pos // ps] * ps + key_pos % ps
    if one:  # the new tokens' KV rows: the longer rows' through ``table``, a one-token row's from its page
        row_of = torch.full((len(seqs),), -1, dtype=torch.int64)
        row_of[gather] = torch.arange(len(gather))
        at_row = row_of[owner]
        rows = torch.empty(len(pos), dtype=torch.int64)
        mine = at_row >= 0
        rows[mine] = table[at_row[mine], pos[mine] // ps] * ps + pos[mine] % ps
        rows[~mine] = torch.tensor([seqs[i].pages[seqs[i].length // ps] * ps + seqs[i].length % ps for i in one])
    else:
        rows = table[owner, pos // ps] * ps + pos % ps
    cu = _cu(lens)
    ids = torch.tensor([t for ts in toks for t in ts], dtype=torch.int64)
    slots = torch.tensor([s.slot for s in seqs], dtype=torch.int64)
    longs = [ids, pos, slots, rows, key_rows, (cu[1:] - 1).long()]
    if one:
        extend_tok = torch.cat([torch.arange(int(cu[i]), int(cu[i + 1])) for i in gather])
        longs += [cu[one].long(), torch.tensor(one, dtype=torch.int64), extend_tok]
    ints = [cu, torch.tensor(ctx, dtype=torch.int32)] + ([] if one else [table.to(torch.int32)])
    (ids, positions, slots, rows_d, key_rows_d, last, *paged_parts), (cu_d, ctx_d, *table_d) = _upload_by_dtype(
        pool.device, longs, ints
    )
    paged_rows = None
    if one:
        decode_tok, decode_seq, extend_tok = paged_parts
        paged_rows = PagedRows(decode_tok, decode_seq, extend_tok, _cu([lens[i] for i in gather]))
        width = max(len(s.pages) for s in seqs)
        block_table = pool.block_table[:, :width].index_select(0, slots)  # the pool's rows (``_decode_plan``)
    else:
        block_table = table_d[0].view(table.shape)
    return ForwardPlan(
        seqs=tuple(seqs),
        new_tokens=toks,
        decode_only=all(n == 1 for n in lens),
        ids=ids,
        positions=positions,
        slots=slots,
        rows=rows_d,
        cu_seqlens=cu_d,
        cu_host=cu,
        key_rows=key_rows_d,
        cu_keys_host=_cu(key_ctx),
        block_table=block_table,
        context_lens=ctx_d,
        last_rows=last,
        paged_rows=paged_rows,
    )


def _decode_plan(pool: StatePool, seqs: Sequence[PoolSeq], toks: tuple[tuple[int, ...], ...]) -> ForwardPlan:
    """A decode-only plan for paged attention: a few host ints per sequence, one host tensor and one
    upload per dtype; the block table is the pool's rows of the sequences' slots
    (``StatePool.block_table``, gathered on the device), cut to the widest sequence's pages."""
    ps, n = pool.page_size, len(seqs)
    ctx = _context_lengths(seqs, [1] * n)
    width = max(len(s.pages) for s in seqs)
    longs = [t[0] for t in toks]  # ids, positions, slots, KV rows, logit rows: [5 * n]
    longs += [s.length for s in seqs]
    longs += [s.slot for s in seqs]
    longs += [s.pages[s.length // ps] * ps + s.length % ps for s in seqs]
    longs += range(n)
    cu = torch.arange(n + 1, dtype=torch.int32)
    longs_d = upload(torch.tensor(longs, dtype=torch.int64), pool.device)
    ints_d = upload(torch.tensor([*range(n + 1), *ctx], dtype=torch.int32), pool.device)
    ids, positions, slots, rows, last = longs_d.view(5, n).unbind(0)
    return ForwardPlan(
        seqs=tuple(seqs),
        new_tokens=toks,
        decode_only=True,
        ids=ids,
        positions=positions,
        slots=slots,
        rows=rows,
        cu_seqlens=ints_d[: n + 1],
        cu_host=cu,
        key_rows=rows[:0],
        cu_keys_host=torch.zeros(n + 1, dtype=torch.int32),
        block_table=pool.block_table[:, :width].index_select(0, slots),
        context_lens=ints_d[n + 1 :],
        last_rows=last,
    )


def _context_lengths(seqs: Sequence[PoolSeq], new: Sequence[int]) -> list[int]:
    """Each sequence's length after its ``new`` tokens; raises where that exceeds its reserved pages."""
    ctx = [s.length + n for s, n in zip(seqs, new, strict=True)]
    for s, c in zip(seqs, ctx, strict=True):
        if c > s.capacity:
            raise ValueError(f"sequence would hold {c} tokens; it reserved {s.capacity}")
    return ctx


def _upload_by_dtype(
    device: torch.device, longs: Sequence[torch.Tensor], ints: Sequence[torch.Tensor]
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """1-D int64 and int32 host tensors on ``device``: one copy per dtype, split into views there."""
    out: list[list[torch.Tensor]] = []
    for parts in (longs, ints):
        flat = upload(torch.cat([p.reshape(-1) for p in parts]), device)
        out.append(list(torch.split(flat, [p.numel() for p in parts])))
    return out[0], out[1]
