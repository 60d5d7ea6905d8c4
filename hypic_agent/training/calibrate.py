"""Teacher activation statistics that set the student's initial weights (see ``convert.py``).

One no-grad pass of the all-attention teacher over calibration blocks collects, per layer:

* the Gram matrix and mean of the normed mixer input ``x [N, D]``, enough to solve the ridge
  regression ``x . u ~= 1`` (a direction whose projection is nearly constant over tokens: the
  only way to hold a bias-free gate open);
* the mean RMS of q, k, v per head (un-rotated) and the per-dimension mean square of the
  attention output before ``o_proj`` (``[Dh]``, over tokens and heads).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hypic_agent.runtime.models.hybrid import HybridForCausalLM
from hypic_agent.training.forward import run_model


@dataclass
class LayerStats:
    """Sufficient statistics of one teacher layer (fp64 accumulators)."""

    gram: torch.Tensor  # [D, D] sum of x x^T
    xsum: torch.Tensor  # [D]
    n: int
    q_rms: torch.Tensor  # [H] mean over tokens of the per-head RMS of q
    k_rms: torch.Tensor  # [Hkv]
    v_rms: torch.Tensor  # [Hkv]
    o_ms: torch.Tensor  # [Dh] mean square of the attention output per dim

    @property
    def x_rms(self) -> float:
        return float((self.gram.diagonal().sum() / (self.n * self.gram.shape[0])).sqrt())

    def gate_direction(self, ridge: float = 1e-3) -> tuple[torch.Tensor, float, float]:
        """Ridge solution ``u`` of ``x . u ~= 1`` and the mean / std of ``x . u`` over the tokens.

        ``u = (G / n + lam I)^-1 mean(x)`` with ``lam = ridge * trace(G / n) / D``, rescaled so that
        the mean of ``x . u`` is 1 (ridge shrinkage undone); the std is then relative.
        """
        d = self.gram.shape[0]
        g = self.gram / self.n
        m = self.xsum / self.n
        lam = ridge * float(g.diagonal().sum()) / d
        u = torch.linalg.solve(g + lam * torch.eye(d, dtype=g.dtype), m)
        mean = float(u @ m)
        std = max(float(u @ g @ u) - mean**2, 0.0) ** 0.5
        if mean > 1e-6:
            u, std, mean = u / mean, std / mean, 1.0
        return u, mean, std


class _Collector:
    def __init__(self) -> None:
        self.acc: dict[tuple[int, str], torch.Tensor] = {}
        self.n: dict[int, int] = {}

    def _add(self, key: tuple[int, str], t: torch.Tensor) -> None:
        self.acc[key] = self.acc[key] + t if key in self.acc else t

    def __call__(self, idx: int, name: str, t: torch.Tensor) -> None:
        t = t.detach().double()  # accumulate on the model's device
        if name == "x":
            x = t.reshape(-1, t.shape[-1])
            self._add((idx, "gram"), x.T @ x)
            self._add((idx, "xsum"), x.sum(0))
            self.n[idx] = self.n.get(idx, 0) + x.shape[0]
        elif name in ("q", "k", "v"):  # [B, L, H, Dh] -> sum over tokens of per-head rms
            rms = t.pow(2).mean(-1).sqrt().reshape(-1, t.shape[-2])
            self._add((idx, f"{name}_rms"), rms.sum(0))
        elif name == "o":
            self._add((idx, "o_ms"), t.pow(2).reshape(-1, t.shape[-1]).sum(0))


@torch.no_grad()
def collect_stats(teacher: HybridForCausalLM, blocks: torch.Tensor, batch: int = 8) -> list[LayerStats]:
    """Statistics of every (attention) layer of ``teacher`` over ``blocks [N, L]`` token ids."""
    col = _Collector()
    dev = next(teacher.parameters()).device
    for i in range(0, blocks.shape[0], batch):
        ids = blocks[i : i + batch].to(dev)
        run_model(teacher, ids, probe=_with_v(teacher, col))
    col.acc = {k: v.cpu() for k, v in col.acc.items()}
    out = []
    for i, layer in enumerate(teacher.layers):
        if layer.self_attn is None:
            raise ValueError(f"teacher layer {i} is not an attention layer; convert an all-attention model")
        n = col.n[i]
        heads = layer.self_attn.hq
        out.append(
            LayerStats(
                gram=col.acc[(i, "gram")],
                xsum=col.acc[(i, "xsum")],
                n=n,
                q_rms=col.acc[(i, "q_rms")] / n,
                k_rms=col.acc[(i, "k_rms")] / n,
                v_rms=col.acc[(i, "v_rms")] / n,
                o_ms=col.acc[(i, "o_ms")] / (n * heads),
            )
        )
    return out


def _with_v(model: HybridForCausalLM, col: _Collector):  # type: ignore[no-untyped-def]
    """Probe that also records v (recomputed from x: the attention mixer probes only q, k)."""

    def probe(idx: int, name: str, t: torch.Tensor) -> None:
        col(idx, name, t)
        attn = model.layers[idx].self_attn
        if name == "x" and attn is not None:
            B, L, D = t.shape
            v = attn.v_proj(t.reshape(B * L, D)).view(B, L, attn.hkv, attn.d)
            col(idx, "v", v)

    return probe
