"""Gated delta rule over packed segments that also returns each segment's body transition pair.

Entry building (HYPIC §3) needs, per segment, the layer output of the whole segment and the pair
``(T_body, S_body)`` of its body: the tokens after the seam window, from a zero state. The
reference runs the two separately (``gated_delta_rule`` over whole segments, then
``transition_pairs`` over the bodies), recomputing the per-chunk WY factors of the bodies.

On CUDA the fla path shares them in one varlen pass over ``SeamSplit``'s sub-sequences (every
segment cut into its window and its body): the WY factors (``w, u``) and chunked decays feed fla's
summary kernel ``chunk_cp_fwd_h`` (every sub-sequence's pair from zero), the windows' ``S`` are the
states entering the bodies, and the forward runs all sub-sequences from those states; a pair costs
one extra state sweep instead of a second forward, with no token gathers (``gdn_pairs_fla``).

``gated_delta_rule_after_pairs`` is the combine-side twin: pieces (seam windows, the suffix) get
their pairs, a caller-supplied chain turns them into incoming states, and the pieces then run
from those states with the same WY factors.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from . import gdn as gdn_ops
from . import pairs as pair_ops
from .backend import resolve_backend, to_device_async

log = logging.getLogger(__name__)
CHUNK = 64  # fla's chunk size for the delta rule: the sub-sequence chunk tables use it
_SHARED_FAILED: list[str] = []  # set once the shared-WY fla path raised in this process
R = TypeVar("R")


def _shared_fla(call: Callable[[Any], R]) -> R | None:
    """Run ``call(gdn_pairs_fla module)``; None once it has failed in this process (fla internals moved:
    the callers then serve through the public fla ops). Out-of-memory errors propagate."""
    if _SHARED_FAILED:
        return None
    try:
        from . import gdn_pairs_fla

        return call(gdn_pairs_fla)
    except torch.cuda.OutOfMemoryError:
        raise
    except Exception as exc:
        _SHARED_FAILED.append(repr(exc))
        log.warning("shared-WY fla path failed (%r); using separate fla passes from now on", exc)
        return None


@dataclass(frozen=True)
class SeamSplit:
    """Packed segments split into seam windows and bodies; built once per batch, shared by all layers.

    Reference layout (the separate passes): ``body_idx [Tb]`` packed token indices of the bodies,
    ``cu_body [Nb+1]`` int64, ``body_segs`` the segments with a non-empty body (also on the device as
    ``body_seg_idx``; indexing a CUDA tensor with a Python list copies it with a blocking copy).

    Sub-sequence layout (the shared-WY fla pass): every segment is cut into its window and its body,
    each a sequence of its own, in packed order, so one varlen pass runs all of them with no token
    gathers: ``cu_sub [M+1]`` int64 and fla's ``sub_chunks [NC, 2]`` / ``sub_chunk_offsets [M+1]``
    (64-token chunks, computed on the host: no device sync); ``sub_enter [M]`` the sub-sequence whose
    zero-start state ``S`` enters each one (its window, for a body behind one), or ``M`` for a zero
    state; ``body_sub [Nb]`` the body sub-sequences in ``body_segs`` order; ``seg_last_sub [N]``
    the sub-sequence that ends each segment (its final state is the segment's).
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
    sub_enter: torch.Tensor
    body_sub: torch.Tensor
    seg_last_sub: torch.Tensor

    @classmethod
    def build(cls, lengths: Sequence[int], seams: Sequence[int], device: torch.device) -> SeamSplit:
        """lengths, seams: per segment (``0 <= seams[i] <= lengths[i]``)."""
        if len(lengths) != len(seams) or any(not 0 <= s <= n for n, s in zip(lengths, seams, strict=True)):
            raise ValueError(f"need 0 <= seams[i] <= lengths[i] per segment; got {list(seams)} for {list(lengths)}")
        starts = [0, *itertools.accumulate(lengths)]
        seam_segs = [j for j, s in enumerate(seams) if s > 0]
        body_segs = [j for j, (n, s) in enumerate(zip(lengths, seams, strict=True)) if n - s > 0]
        body_list = [t for j in body_segs for t in range(starts[j] + seams[j], starts[j + 1])]
        sub_lens: list[int] = []
        enter: list[int | None] = []
        body_sub: list[int] = []
        last_sub: list[int] = []
        for n, s in zip(lengths, seams, strict=True):
            window = None
            if s > 0:
                window = len(sub_lens)
                sub_lens.append(s)
                enter.append(None)
            if n - s > 0:
                body_sub.append(len(sub_lens))
                sub_lens.append(n - s)
                enter.append(window)
            last_sub.append(len(sub_lens) - 1)
        m = len(sub_lens)
        chunks = [(i, c) for i, n in enumerate(sub_lens) for c in range(-(-n // CHUNK))]
        chunk_counts = [-(-n // CHUNK) for n in sub_lens]

        def dev(xs: list[int] | list[tuple[int, int]]) -> torch.Tensor:
            return to_device_async(torch.tensor(xs, dtype=torch.int64), device)

        def cu(lens: list[int]) -> torch.Tensor:
            return dev([0, *itertools.accumulate(lens)])

        return cls(
            n=len(lengths),
            total=starts[-1],
            seam_segs=seam_segs,
            body_segs=body_segs,
            body_idx=dev(body_list),
            cu_body=cu([lengths[j] - seams[j] for j in body_segs]),
            body_seg_idx=dev(body_segs),
            sub_lens=sub_lens,
            cu_sub=cu(sub_lens),
            sub_chunks=dev(chunks).view(-1, 2),
            sub_chunk_offsets=cu(chunk_counts),
            sub_enter=dev([m if e is None else e for e in enter]),
            body_sub=dev(body_sub),
            seg_last_sub=dev(last_sub),
        )

    def enter_states(self, S_sub: torch.Tensor) -> torch.Tensor:
        """Zero-start states of the sub-sequences ``[M, HV, K, V]`` -> the state entering each one: a
        window (or a body without one) enters from zero, a body from its window's final state, which
        is the window's ``S`` (it starts from zero)."""
        return torch.cat([S_sub, S_sub.new_zeros(1, *S_sub.shape[1:])]).index_select(0, self.sub_enter)

    def segment_results(
        self, fin_sub: torch.Tensor, T_sub: torch.Tensor, S_sub: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-sub-sequence finals ``[M, HV, K, V]`` and pairs -> per-segment (finals ``[N, HV, K, V]``,
        T_body ``[N, HV, K, K]``, S_body ``[N, HV, K, V]``); ``(I, 0)`` for a segment without a body."""
        finals = fin_sub.index_select(0, self.seg_last_sub)
        Tb, Sb = T_sub.index_select(0, self.body_sub), S_sub.index_select(0, self.body_sub)
        if len(self.body_segs) == self.n:  # every segment has a body (the common case)
            return finals, Tb, Sb
        T, S = identity_pairs(self.n, S_sub.shape[1], T_sub.shape[2], S_sub.shape[3], S_sub.device, S_sub.dtype)
        if self.body_segs:
            T[self.body_seg_idx], S[self.body_seg_idx] = Tb, Sb
        return finals, T, S


def gated_delta_rule_with_pairs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor,
    split: SeamSplit,
    use_qk_l2norm: bool = True,
    scale: float | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Whole-segment outputs plus body pairs, every segment from a zero state.

    Args:
        q, k: ``[T, H, K]``; v: ``[T, HV, V]``; g, beta: ``[T, HV]``; cu_seqlens ``[N+1]`` (the segments).
        split: seam windows / bodies of the same N segments.
    Returns:
        o ``[T, HV, V]`` (q's dtype), final states ``[N, HV, K, V]``, T_body ``[N, HV, K, K]`` and
        S_body ``[N, HV, K, V]`` fp32 (``(I, 0)`` for a segment without a body).
    """
    if split.total != k.shape[0]:
        raise ValueError(f"split covers {split.total} tokens, the batch has {k.shape[0]}")
    be = resolve_backend(backend, q.device)
    if be == "fla":
        out = _shared_fla(lambda m: m.gdn_with_pairs_fla(q, k, v, g, beta, split, use_qk_l2norm, scale))
        if out is not None:
            return out
    return gdn_with_pairs_separate(q, k, v, g, beta, cu_seqlens, split, use_qk_l2norm, scale, be)


def identity_pairs(
    n: int, hv: int, kd: int, vd: int, device: torch.device, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``(I [n, HV, K, K], 0 [n, HV, K, V])``: the pair of an empty span."""
    T = torch.eye(kd, device=device, dtype=dtype).expand(n, hv, kd, kd).clone()
    return T, torch.zeros(n, hv, kd, vd, device=device, dtype=dtype)


def gdn_with_pairs_separate(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    split: SeamSplit,
    use_qk_l2norm: bool,
    scale: float | None,
    backend: str = "torch",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Reference (``backend="torch"``): one ``gated_delta_rule`` over whole segments, then
    ``transition_pairs`` over the bodies, which recomputes their WY factors."""
    o, final = gdn_ops.gated_delta_rule(
        q, k, v, g, beta, cu_seqlens=cu_seqlens, use_qk_l2norm=use_qk_l2norm, scale=scale, backend=backend
    )
    assert final is not None
    T, S = identity_pairs(split.n, v.shape[1], k.shape[2], v.shape[2], q.device)
    if split.body_segs:
        b = split.body_idx
        Tb, Sb = pair_ops.transition_pairs(
            k[b], v[b], g[b], beta[b], cu_seqlens=split.cu_body, use_qk_l2norm=use_qk_l2norm, backend=backend
        )
        T[split.body_seg_idx], S[split.body_seg_idx] = Tb.float(), Sb.float()
    return o, final, T, S


EnterFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def gated_delta_rule_after_pairs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor,
    enter: EnterFn,
    use_qk_l2norm: bool = True,
    scale: float | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pieces whose incoming states depend on their own pairs (the HYPIC combine).

    Computes every piece's pair from a zero state, asks ``enter(T [P, HV, K, K], S [P, HV, K, V])``
    (fp32) for the states entering the pieces ``[P, HV, K, V]``, then runs the pieces from them.
    On CUDA both steps use the same WY factors (one set of intra-chunk kernels instead of two).

    Args:
        q, k: ``[T, H, K]``; v: ``[T, HV, V]``; g, beta: ``[T, HV]``; cu_seqlens ``[P+1]``.
    Returns:
        o ``[T, HV, V]`` (q's dtype) and final states ``[P, HV, K, V]`` fp32.
    """
    be = resolve_backend(backend, q.device)
    if be == "fla":
        out = _shared_fla(lambda m: m.gdn_after_pairs_fla(q, k, v, g, beta, cu_seqlens, enter, use_qk_l2norm, scale))
        if out is not None:
            return out
    T, S = pair_ops.transition_pairs(k, v, g, beta, cu_seqlens=cu_seqlens, use_qk_l2norm=use_qk_l2norm, backend=be)
    h0 = enter(T.float(), S.float())
    o, final = gdn_ops.gated_delta_rule(
        q, k, v, g, beta, cu_seqlens=cu_seqlens, initial_state=h0.contiguous(), use_qk_l2norm=use_qk_l2norm,
        scale=scale, backend=be,
    )  # fmt: skip
    assert final is not None
    return o, final
