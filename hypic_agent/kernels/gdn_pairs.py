"""Gated delta rule over packed segments that also returns each segment's body transition pair.

Entry building (HYPIC §3) needs, per segment, the layer output of the whole segment and the pair
``(T_body, S_body)`` of its body: the tokens after the seam window, from a zero state. The
reference runs the two separately (``gated_delta_rule`` over whole segments, then
``transition_pairs`` over the bodies), recomputing the per-chunk WY factors of the bodies.

On CUDA the fla path shares them: pass 1 runs the seam windows from zero states; pass 2 runs the
bodies from the seam windows' final states, and the WY factors (``w, u``) and chunked decays it
computes feed fla's summary kernel ``chunk_cp_fwd_h`` as well, so a pair costs one extra state
sweep instead of a second forward (``gdn_pairs_fla``).

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

    ``seam_idx [Ts]`` / ``body_idx [Tb]``: packed token indices; ``cu_seam [Ns+1]`` / ``cu_body [Nb+1]``
    int64; ``seam_segs`` / ``body_segs``: the segments that have a non-empty window / body, also as
    device index tensors ``seam_seg_idx`` / ``body_seg_idx`` (indexing a CUDA tensor with a Python
    list copies the list to the device with a blocking copy: a stream sync per layer).
    """

    n: int
    total: int
    seam_segs: list[int]
    body_segs: list[int]
    seam_idx: torch.Tensor
    body_idx: torch.Tensor
    cu_seam: torch.Tensor
    cu_body: torch.Tensor
    seam_seg_idx: torch.Tensor
    body_seg_idx: torch.Tensor

    @classmethod
    def build(cls, lengths: Sequence[int], seams: Sequence[int], device: torch.device) -> SeamSplit:
        """lengths, seams: per segment (``0 <= seams[i] <= lengths[i]``)."""
        if len(lengths) != len(seams) or any(not 0 <= s <= n for n, s in zip(lengths, seams, strict=True)):
            raise ValueError(f"need 0 <= seams[i] <= lengths[i] per segment; got {list(seams)} for {list(lengths)}")
        starts = [0, *itertools.accumulate(lengths)]
        seam_segs = [j for j, s in enumerate(seams) if s > 0]
        body_segs = [j for j, (n, s) in enumerate(zip(lengths, seams, strict=True)) if n - s > 0]
        seam_list = [t for j in seam_segs for t in range(starts[j], starts[j] + seams[j])]
        body_list = [t for j in body_segs for t in range(starts[j] + seams[j], starts[j + 1])]

        def dev(xs: list[int]) -> torch.Tensor:
            return to_device_async(torch.tensor(xs, dtype=torch.int64), device)

        def cu(lens: list[int]) -> torch.Tensor:
            return dev([0, *itertools.accumulate(lens)])

        return cls(
            n=len(lengths),
            total=starts[-1],
            seam_segs=seam_segs,
            body_segs=body_segs,
            seam_idx=dev(seam_list),
            body_idx=dev(body_list),
            cu_seam=cu([seams[j] for j in seam_segs]),
            cu_body=cu([lengths[j] - seams[j] for j in body_segs]),
            seam_seg_idx=dev(seam_segs),
            body_seg_idx=dev(body_segs),
        )


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
    n: int, hv: int, kd: int, vd: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``(I [n, HV, K, K], 0 [n, HV, K, V])`` fp32: the pair of an empty span."""
    T = torch.eye(kd, device=device, dtype=torch.float32).expand(n, hv, kd, kd).clone()
    return T, torch.zeros(n, hv, kd, vd, device=device, dtype=torch.float32)


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
