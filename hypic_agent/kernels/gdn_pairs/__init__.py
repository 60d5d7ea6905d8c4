"""Gated delta rule over packed segments that also returns each segment's body transition pair.

Entry building (HYPIC §3) needs, per segment, the layer output of the whole segment and the pair
``(T_body, S_body)`` of its body: the tokens after the seam window, from a zero state. The
reference runs the two separately (``gated_delta_rule`` over whole segments, then
``transition_pairs`` over the bodies), recomputing the per-chunk WY factors of the bodies.

On CUDA the fla path shares them in one varlen pass over ``SeamSplit``'s sub-sequences (every
segment cut into its window and its body): one set of WY factors (``w, u``) and chunked decays
feeds the windows' own zero-start state pass (their ``S`` are the states entering the bodies), the
forward from those states, and the body pairs (``body_pairs``: a state pass on the identity with
zero values for every ``T``, a body's ``S`` as its final state less ``T_body S_win``), written
straight into the cache entries' tensors (``PairSink``). A pair costs one extra state sweep instead
of a second forward, with no gathers of the bodies (``gdn_pairs_fla``). Elsewhere, and where that
path fails, the separate passes run (``gdn_pairs_torch``).

``gated_delta_rule_after_pairs`` is the combine-side twin: pieces (seam windows, the suffix) get
their pairs, a caller-supplied chain turns them into incoming states, and the pieces then run
from those states with the same WY factors.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from ..backend import resolve_backend
from ..pair_sink import PairSink
from ..seam_split import CHUNK, SeamSplit
from .gdn_pairs_torch import EnterFn, gdn_after_pairs_separate, gdn_with_pairs_separate

__all__ = [
    "CHUNK",
    "EnterFn",
    "PairSink",
    "SeamSplit",
    "gated_delta_rule_after_pairs",
    "gated_delta_rule_into_pairs",
    "gated_delta_rule_with_pairs",
    "gdn_after_pairs_separate",
    "gdn_with_pairs_separate",
]

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


def gated_delta_rule_into_pairs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor,
    split: SeamSplit,
    sink: PairSink,
    use_qk_l2norm: bool = True,
    scale: float | None = None,
    backend: str = "auto",
    finals: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Whole-segment outputs, every segment from a zero state; its body pair goes into ``sink``.

    Args:
        q, k: ``[T, H, K]``; v: ``[T, HV, V]``; g, beta: ``[T, HV]``; cu_seqlens ``[N+1]`` (the segments).
        split: seam windows / bodies of the same N segments.
        sink: N destinations (``PairSink``): body pairs ``T_body [HV, K, K]``, ``S_body [HV, K, V]`` in
            the sink's dtype (``(I, 0)`` for a segment without a body).
        finals: also return the segments' final states.
    Returns:
        o ``[T, HV, V]`` (q's dtype) and final states ``[N, HV, K, V]`` fp32 (None unless ``finals``).
    """
    if split.total != k.shape[0]:
        raise ValueError(f"split covers {split.total} tokens, the batch has {k.shape[0]}")
    if len(sink.T) != split.n:
        raise ValueError(f"sink holds {len(sink.T)} pairs for {split.n} segments")
    be = resolve_backend(backend, q.device)
    if be == "fla":
        out = _shared_fla(lambda m: m.gdn_with_pairs_fla(q, k, v, g, beta, split, use_qk_l2norm, scale, sink, finals))
        if out is not None:
            return out
    o, fin, T, S = gdn_with_pairs_separate(q, k, v, g, beta, cu_seqlens, split, use_qk_l2norm, scale, be)
    sink.fill(T, S)
    return o, fin if finals else None


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
    """``gated_delta_rule_into_pairs`` into fresh stacked fp32 pairs.

    Returns:
        o ``[T, HV, V]`` (q's dtype), final states ``[N, HV, K, V]``, T_body ``[N, HV, K, K]`` and
        S_body ``[N, HV, K, V]`` fp32 (``(I, 0)`` for a segment without a body).
    """
    sink = PairSink.stacked(split.n, v.shape[1], k.shape[2], v.shape[2], q.device, torch.float32)
    o, fin = gated_delta_rule_into_pairs(
        q, k, v, g, beta, cu_seqlens=cu_seqlens, split=split, sink=sink, use_qk_l2norm=use_qk_l2norm, scale=scale,
        backend=backend, finals=True,
    )  # fmt: skip
    assert fin is not None
    return (o, fin, *sink.stacks())


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
    return gdn_after_pairs_separate(q, k, v, g, beta, cu_seqlens, enter, use_qk_l2norm, scale, be)
