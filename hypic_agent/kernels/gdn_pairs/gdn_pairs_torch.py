"""The reference of ``gdn_pairs`` (separate passes): the gated delta rule over whole segments, then
the body pairs recomputed by ``transition_pairs`` (``gdn_with_pairs_separate``); for the combine,
the pieces' pairs, the caller's chain, then the pieces from the states it gives
(``gdn_after_pairs_separate``).

Both call the ``gdn`` and ``pairs`` dispatchers with the caller's backend: ``"torch"`` is the
plain-PyTorch reference, ``"fla"`` the same passes on fla's public ops (what ``gdn_pairs`` falls back
to when its shared-WY fla path has failed). Layouts as in ``gdn_pairs``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .. import gdn as gdn_ops
from .. import pairs as pair_ops
from ..seam_split import SeamSplit, identity_pairs

EnterFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``enter(T [P, HV, K, K], S [P, HV, K, V])`` (fp32) -> the states entering the pieces ``[P, HV, K, V]``."""


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


def gdn_after_pairs_separate(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    enter: EnterFn,
    use_qk_l2norm: bool,
    scale: float | None,
    backend: str = "torch",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference of ``gated_delta_rule_after_pairs``: ``transition_pairs`` of the pieces, ``enter``, then
    ``gated_delta_rule`` from the states it gives (the pieces' WY factors computed twice)."""
    T, S = pair_ops.transition_pairs(k, v, g, beta, cu_seqlens=cu_seqlens, use_qk_l2norm=use_qk_l2norm, backend=backend)
    h0 = enter(T.float(), S.float())
    o, final = gdn_ops.gated_delta_rule(
        q, k, v, g, beta, cu_seqlens=cu_seqlens, initial_state=h0.contiguous(), use_qk_l2norm=use_qk_l2norm,
        scale=scale, backend=backend,
    )  # fmt: skip
    assert final is not None
    return o, final
