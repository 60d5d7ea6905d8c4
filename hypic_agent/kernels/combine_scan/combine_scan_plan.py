"""Combine scan, host side: the chain's links (``Piece``, ``Body``), their launch tables
(``ChainTables``) and the WY step plan (``plan_steps``) the Triton kernels (``combine_scan_triton``)
walk; the dispatch is ``combine_scan.gdn_combine_scan``.

A layer's chain (pieces of active tokens and cached bodies) becomes a list of *steps*: each step is
one chunk of at most ``chunk_size`` tokens of a piece (or none) followed by one body (or none). The
chunks' factors do not depend on the running state and are computed for all chunks at once; only
the steps are sequential. The plan is built on the host from the chain tables' host copies, once per
request for all linear layers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..backend import on_device, to_device_async


@dataclass(frozen=True)
class Piece:
    """Active tokens ``[start, end)`` of the packed active sequence."""

    start: int
    end: int


@dataclass(frozen=True)
class Body:
    """A cached body's pair: T ``[HV, K, K]``, S ``[HV, K, V]`` (fp32 or bf16)."""

    T: torch.Tensor
    S: torch.Tensor


ChainLink = Piece | Body


@dataclass
class ChainTables:
    """Launch tables of the Triton kernels for the chains of several layers that share one layout:
    meta ``[n, 3]`` int32 (kind 0 = piece / 1 = body, start, end) and pointers ``[L, n, 2]`` int64
    (data pointers of each body's T and S per layer; 0 for pieces). Built on the host, copied once.
    ``meta_host`` / ``ptrs_host``: the host copies, for ``wy_steps`` (the WY scan's step plan)."""

    meta: torch.Tensor
    ptrs: torch.Tensor
    pair_dtype: torch.dtype
    meta_host: list[tuple[int, int, int]] = field(default_factory=list)
    ptrs_host: torch.Tensor | None = None
    _steps: WYSteps | None = field(default=None, repr=False)

    def wy_steps(self) -> WYSteps:
        """The WY scan's step tables for every layer of these tables (``plan_steps``),
        built on first use."""
        if self._steps is None:
            assert self.ptrs_host is not None
            self._steps = plan_steps(self.meta_host, self.ptrs_host, self.meta.device)
        return self._steps


def tables_from_host(
    meta: list[tuple[int, int, int]], ptrs: torch.Tensor, dtype: torch.dtype, device: torch.device
) -> ChainTables:
    """Tables from the host rows ``meta`` (kind, start, end) and pointers ``[L, n, 2]`` int64, copied
    to ``device`` (the host copies stay with them)."""
    m = torch.tensor(meta, dtype=torch.int32).reshape(-1, 3)
    ptrs = ptrs.contiguous()
    return ChainTables(to_device_async(m, device), to_device_async(ptrs, device), dtype, list(meta), ptrs)


def chain_tables(chains: list[list[ChainLink]], device: torch.device) -> ChainTables:
    """Tables for ``chains`` (one per layer, same piece/body pattern; the pairs must stay alive
    while the tables are in use)."""
    if not chains:
        raise ValueError("need at least one chain")
    meta = [(0, c.start, c.end) if isinstance(c, Piece) else (1, 0, 0) for c in chains[0]]
    ptrs: list[tuple[int, int]] = []
    dtype: torch.dtype | None = None
    for chain in chains:
        if len(chain) != len(meta):
            raise ValueError("all chains of one table must have the same pattern")
        for c in chain:
            if isinstance(c, Piece):
                ptrs.append((0, 0))
                continue
            dtype = dtype or c.T.dtype
            if c.T.dtype != dtype or c.S.dtype != dtype or not (c.T.is_contiguous() and c.S.is_contiguous()):
                raise ValueError("combine scan needs contiguous pairs of one dtype")
            if not (on_device(c.T, device) and on_device(c.S, device)):
                raise ValueError(f"pairs must be on {device}")
            ptrs.append((c.T.data_ptr(), c.S.data_ptr()))
    p = torch.tensor(ptrs, dtype=torch.int64).reshape(len(chains), -1, 2)
    return tables_from_host(meta, p, dtype or torch.float32, device)


# Chunk sizes the planner picks from: the time of one chain step of that size and the latency of
# the factor kernel for it (us, measured on the H200 at the Qwen3.5 shape: a 64-token step runs bigger dots than
# a 16-token one and its factors solve a 64 x 64 triangular system row by row; an 8-token seam window
# pads to either).
STEP_US = {16: 10.0, 64: 20.0}
FACTOR_US = {16: 25.0, 64: 120.0}


@dataclass
class WYSteps:
    """Launch tables: chunks ``[NC, 2]`` int32 (start, end) for the factors; meta ``[NS, 4]`` int32
    (chunk start, end, chunk index or -1, has a body) and ptrs ``[L, NS, 2]`` int64 (each step's body
    T, S pointers per layer, 0 without a body) for the chain; ``bounds [N+1]`` int32: the steps of
    each of its N chains (one, or several requests' by ``merge_steps``); ``chunk_size`` the largest
    chunk; ``body_of``: per step the chain link whose pair it applies, or -1 (host; one chain)."""

    chunk_size: int
    chunks: torch.Tensor
    meta: torch.Tensor
    ptrs: torch.Tensor
    bounds: torch.Tensor
    body_of: list[int] = field(default_factory=list)

    def step_pointers(self, ptrs: torch.Tensor) -> torch.Tensor:
        """The chain's host pointer table ``[L, n, 2]`` -> the steps' ``[L, NS, 2]`` (host), for
        rewriting ``ptrs`` when only the pairs change (same chain layout)."""
        return _step_pointers(self.body_of, ptrs)


def _step_pointers(body_of: list[int], ptrs: torch.Tensor) -> torch.Tensor:
    """Host pointers ``[L, n, 2]`` of a chain's links -> those of its steps ``[L, NS, 2]`` (0: no body)."""
    out = torch.zeros(ptrs.shape[0], len(body_of), 2, dtype=torch.int64)
    has = [s for s, link in enumerate(body_of) if link >= 0]
    if has:
        out[:, has] = ptrs[:, [body_of[s] for s in has]]
    return out


def _chunks(lo: int, hi: int, size: int) -> list[tuple[int, int]]:
    return [(a, min(a + size, hi)) for a in range(lo, hi, size)]


def choose_chunk_size(piece_lens: list[int]) -> int:
    """The chunk size with the cheapest scan for pieces of these lengths (``STEP_US``, ``FACTOR_US``)."""

    def cost(size: int) -> float:
        return STEP_US[size] * sum(-(-n // size) for n in piece_lens) + FACTOR_US[size]

    return min(STEP_US, key=lambda size: (cost(size), size))


def _host_steps(
    meta: list[tuple[int, int, int]], chunk_size: int
) -> tuple[list[tuple[int, int]], list[list[int]], list[int]]:
    """One chain's steps on the host: (chunks, steps ``[start, end, chunk index, has body]``, body_of)."""
    chunks: list[tuple[int, int]] = []
    steps: list[list[int]] = []  # start, end, chunk index, has body
    body_of: list[int] = []  # per step: the link whose pair it applies, or -1
    for i, (kind, a, b) in enumerate(meta):
        if kind == 0:
            for c in _chunks(a, b, chunk_size):
                steps.append([c[0], c[1], len(chunks), 0])
                body_of.append(-1)
                chunks.append(c)
        elif steps and not steps[-1][3]:
            steps[-1][3] = 1
            body_of[-1] = i
        else:
            steps.append([0, 0, -1, 1])
            body_of.append(i)
    return chunks, steps, body_of


def _upload(
    chunk_size: int, chunks: list[tuple[int, int]], steps: list[list[int]], bounds: list[int], device: torch.device
) -> WYSteps:
    return WYSteps(
        chunk_size,
        to_device_async(torch.tensor(chunks, dtype=torch.int32).reshape(-1, 2), device),
        to_device_async(torch.tensor(steps, dtype=torch.int32).reshape(-1, 4), device),
        torch.empty(0),
        to_device_async(torch.tensor(bounds, dtype=torch.int32), device),
    )


def plan_steps(
    meta: list[tuple[int, int, int]], ptrs: torch.Tensor, device: torch.device, chunk_size: int | None = None
) -> WYSteps:
    """``meta``: the chain's host rows (kind 0 = piece / 1 = body, start, end); ``ptrs [L, n, 2]`` the
    host pointer table (``ChainTables``) -> the steps on ``device``. ``chunk_size``: None picks one."""
    if chunk_size is None:
        chunk_size = choose_chunk_size([b - a for kind, a, b in meta if kind == 0 and b > a])
    chunks, steps, body_of = _host_steps(meta, chunk_size)
    out = _upload(chunk_size, chunks, steps, [0, len(steps)], device)
    out.body_of = body_of
    out.ptrs = to_device_async(out.step_pointers(ptrs), device)
    return out


def merge_steps(tables: list[ChainTables], offsets: list[int], device: torch.device) -> WYSteps:
    """The chains of several requests' tables (each over its own active rows, which start at
    ``offsets[i]`` of one packed forward) as one launch's steps: chunks and steps shifted to the packed
    rows, ``bounds`` delimiting each request's steps, ``ptrs [L, NS, 2]`` their pairs layer by layer (the
    tables must have the same number of layers). One chunk size for all (picked over every piece)."""
    if len(tables) != len(offsets) or not tables:
        raise ValueError("need one row offset per table, and at least one table")
    n_layers = {t.ptrs_host.shape[0] for t in tables if t.ptrs_host is not None}
    if len(n_layers) != 1 or any(t.ptrs_host is None for t in tables):
        raise ValueError("merged tables need host pointers of one layer count")
    size = choose_chunk_size([b - a for t in tables for kind, a, b in t.meta_host if kind == 0 and b > a])
    chunks: list[tuple[int, int]] = []
    steps: list[list[int]] = []
    bounds = [0]
    blocks: list[torch.Tensor] = []
    for t, off in zip(tables, offsets, strict=True):
        c, s, body_of = _host_steps(t.meta_host, size)
        base = len(chunks)
        chunks += [(a + off, b + off) for a, b in c]
        steps += [[a + off, b + off, ci + base if ci >= 0 else -1, has] for a, b, ci, has in s]
        bounds.append(len(steps))
        assert t.ptrs_host is not None
        blocks.append(_step_pointers(body_of, t.ptrs_host))
    out = _upload(size, chunks, steps, bounds, device)
    out.ptrs = to_device_async(torch.cat(blocks, dim=1), device)
    return out
