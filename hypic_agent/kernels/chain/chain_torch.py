"""Plain-PyTorch twins of ``chain.chain_scan`` and ``chain.compose_body_pointers`` (the references,
run on CPU and as the Triton kernels' oracle): a loop of batched matmuls, fp32.

Layouts: h0 ``[HV, K, V]``; pairs ``T [n, HV, K, K]``, ``S [n, HV, K, V]``; ``states[i+1] = T[i] @
states[i] + S[i]``.
"""

from __future__ import annotations

import torch


def chain_scan_torch(h0: torch.Tensor, T: torch.Tensor, S: torch.Tensor) -> torch.Tensor:
    """Reference: h0 ``[HV, K, V]``, T ``[n, HV, K, K]``, S ``[n, HV, K, V]`` -> ``[n+1, HV, K, V]`` fp32."""
    out = h0.new_empty(T.shape[0] + 1, *h0.shape, dtype=torch.float32)
    out[0] = h0.float()
    ts, ss, outs = T.float().unbind(0), S.float().unbind(0), out.unbind(0)
    for i in range(len(ts)):
        torch.baddbmm(ss[i], ts[i], outs[i], out=outs[i + 1])
    return out


def compose_bodies(chains: list[list[tuple[torch.Tensor, torch.Tensor]]], *, transition: bool = True) -> torch.Tensor:
    """Reference: the state after each chain of pairs from a zero state.

    Args:
        chains: L chains of n >= 1 pairs ``(T [HV, K, K], S [HV, K, V])``: the pairs of a ``w = 0``
            prompt's leading bodies, one chain per linear layer.
        transition: ``h <- T @ h + S``; False: ``h <- h + S`` (the ``addition`` ablation).
    Returns:
        ``[L, HV, K, V]`` fp32.
    """
    if not chains or not all(chains):
        raise ValueError("need at least one chain, each of at least one pair")
    out = []
    for chain in chains:
        h = chain[0][1].float()  # T_0 @ 0 + S_0
        for T, S in chain[1:]:
            h = (torch.bmm(T.float(), h) if transition else h) + S.float()
        out.append(h)
    return torch.stack(out)
