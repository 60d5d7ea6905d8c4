"""Packed segments cut into seam windows and bodies: the index tables entry building shares by layers.

Entry building (HYPIC §3) runs every cold segment once and keeps, per linear layer, the pair of its
*body* (the tokens after the seam window). ``SeamSplit`` holds, for one packed batch, every table
that needs: built once on the host (no device sync) and shared by all linear layers.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ._varlen import concat_ranges, fla_chunk_tables
from .backend import upload_int64

CHUNK = 64  # fla's chunk size for the delta rule: the sub-sequence chunk tables use it


def identity_pairs(
    n: int, hv: int, kd: int, vd: int, device: torch.device, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``(I [n, HV, K, K], 0 [n, HV, K, V])``: the pair of an empty span."""
    T = torch.eye(kd, device=device, dtype=dtype).expand(n, hv, kd, kd).clone()
    return T, torch.zeros(n, hv, kd, vd, device=device, dtype=dtype)


@dataclass(frozen=True)
class SeamSplit:
    """Packed segments split into seam windows and bodies; built once per batch, shared by all layers.

    Reference layout (the separate passes): ``body_idx [Tb]`` packed token indices of the bodies,
    ``cu_body [Nb+1]`` int64, ``body_segs`` the segments with a non-empty body (also on the device as
    ``body_seg_idx``; indexing a CUDA tensor with a Python list copies it with a blocking copy).

    Sub-sequence layout (the shared-WY fla pass): every segment is cut into its window and its body,
    each a sequence of its own, in packed order, so one varlen pass runs all of them with no token
    gathers: ``cu_sub [M+1]`` int64 and fla's ``sub_chunks [NC, 2]`` / ``sub_chunk_offsets [M+1]``
    (64-token chunks, computed on the host: no device sync); ``body_sub [Nb]`` the body
    sub-sequences in ``body_segs`` order; ``seg_last_sub [N]``
    the sub-sequence that ends each segment (its final state is the segment's).

    Window layout (the windows' own zero-start pass, which gives the states entering the bodies before
    the forward runs): ``win_idx [Tw]`` packed token indices of the Nw windows, ``cu_win [Nw+1]``,
    ``win_chunks`` / ``win_chunk_offsets`` their chunk tables; ``sub_enter_win [M]`` the window whose
    state enters each sub-sequence and ``body_enter_win [Nb]`` each body's, ``Nw`` for a zero state.

    Per-segment tables (the pair kernels write segment j's pair): ``seg_body_sub [N]`` the body
    sub-sequence of each segment (-1: no body, the pair is ``(I, 0)``) and ``seg_body_win [N]`` the
    window entering it (``Nw``: none); host copies in ``seg_body_sub_host`` / ``seg_body_win_host``.
    """

    n: int
    total: int
    seam_segs: list[int]
    body_segs: list[int]
    body_idx: torch.Tensor
    cu_body: torch.Tensor
    body_seg_idx: torch.Tensor
    sub_lens: list[int]
    cu_sub: torch.Tensor
    sub_chunks: torch.Tensor
    sub_chunk_offsets: torch.Tensor
    body_sub: torch.Tensor
    seg_last_sub: torch.Tensor
    win_idx: torch.Tensor
    cu_win: torch.Tensor
    win_chunks: torch.Tensor
    win_chunk_offsets: torch.Tensor
    sub_enter_win: torch.Tensor
    body_enter_win: torch.Tensor
    seg_body_sub: torch.Tensor
    seg_body_win: torch.Tensor
    seg_body_sub_host: list[int]
    seg_body_win_host: list[int]

    @classmethod
    def build(cls, lengths: Sequence[int], seams: Sequence[int], device: torch.device) -> SeamSplit:
        """lengths, seams: per segment (``0 <= seams[i] <= lengths[i]``)."""
        if len(lengths) != len(seams) or any(not 0 <= s <= n for n, s in zip(lengths, seams, strict=True)):
            raise ValueError(f"need 0 <= seams[i] <= lengths[i] per segment; got {list(seams)} for {list(lengths)}")
        starts = [0, *itertools.accumulate(lengths)]
        seam_segs = [j for j, s in enumerate(seams) if s > 0]
        body_segs = [j for j, (n, s) in enumerate(zip(lengths, seams, strict=True)) if n - s > 0]
        body_list = concat_ranges([(starts[j] + seams[j], starts[j + 1]) for j in body_segs])
        win_list = concat_ranges([(starts[j], starts[j] + seams[j]) for j in seam_segs])
        nw = len(seam_segs)
        sub_lens: list[int] = []
        enter_win: list[int] = []  # per sub-sequence: the window whose state enters it (nw: zero)
        body_sub: list[int] = []
        last_sub: list[int] = []
        for j, (n, s) in enumerate(zip(lengths, seams, strict=True)):
            win_no = nw
            if s > 0:
                win_no = seam_segs.index(j)
                sub_lens.append(s)
                enter_win.append(nw)
            if n - s > 0:
                body_sub.append(len(sub_lens))
                sub_lens.append(n - s)
                enter_win.append(win_no)
            last_sub.append(len(sub_lens) - 1)
        seg_sub = [-1] * len(lengths)
        seg_win = [nw] * len(lengths)
        for j, sub in zip(body_segs, body_sub, strict=True):
            seg_sub[j], seg_win[j] = sub, enter_win[sub]
        sub_chunks, sub_offsets = fla_chunk_tables(sub_lens, CHUNK)
        win_chunks, win_offsets = fla_chunk_tables([seams[j] for j in seam_segs], CHUNK)

        def cu(lens: list[int]) -> np.ndarray:
            return np.cumsum([0, *lens], dtype=np.int64)

        tables = {  # uploaded as one pinned host buffer (one copy, not 16 pageable ones), then sliced
            "body_idx": body_list,
            "cu_body": cu([lengths[j] - seams[j] for j in body_segs]),
            "body_seg_idx": body_segs,
            "cu_sub": cu(sub_lens),
            "sub_chunks": np.asarray(sub_chunks, dtype=np.int64).reshape(-1),
            "sub_chunk_offsets": sub_offsets,
            "body_sub": body_sub,
            "seg_last_sub": last_sub,
            "win_idx": win_list,
            "cu_win": cu([seams[j] for j in seam_segs]),
            "win_chunks": np.asarray(win_chunks, dtype=np.int64).reshape(-1),
            "win_chunk_offsets": win_offsets,
            "sub_enter_win": enter_win,
            "body_enter_win": [enter_win[i] for i in body_sub],
            "seg_body_sub": seg_sub,
            "seg_body_win": seg_win,
        }
        on_dev = dict(zip(tables, upload_int64(list(tables.values()), device), strict=True))
        on_dev["sub_chunks"] = on_dev["sub_chunks"].view(-1, 2)
        on_dev["win_chunks"] = on_dev["win_chunks"].view(-1, 2)
        return cls(
            n=len(lengths), total=starts[-1], seam_segs=seam_segs, body_segs=body_segs, sub_lens=sub_lens,
            seg_body_sub_host=seg_sub, seg_body_win_host=seg_win, **on_dev,
        )  # fmt: skip

    @staticmethod
    def with_zero_row(S_win: torch.Tensor) -> torch.Tensor:
        """The windows' zero-start states ``[Nw, HV, K, V]`` plus a zero row ``[Nw+1, HV, K, V]``: row
        ``Nw`` is what the window tables point at for "no window"."""
        return torch.cat([S_win, S_win.new_zeros(1, *S_win.shape[1:])])

    def enter_from_windows(self, S_win_z: torch.Tensor) -> torch.Tensor:
        """The windows' zero-start states with their zero row (``with_zero_row``) -> the state entering
        every sub-sequence ``[M, HV, K, V]``: a window (or a body without one) enters from zero, a body
        from its window's final state, which is the window's ``S`` (it starts from zero)."""
        return S_win_z.index_select(0, self.sub_enter_win)

    def segment_finals(self, fin_sub: torch.Tensor) -> torch.Tensor:
        """Per-sub-sequence final states ``[M, HV, K, V]`` -> each segment's ``[N, HV, K, V]`` (its last
        sub-sequence's)."""
        return fin_sub.index_select(0, self.seg_last_sub)
