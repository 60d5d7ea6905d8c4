"""What skipping the state re-rotation costs on Ring-linear (``tiny:bailing_moe_linear``, CPU fp32).

A cached segment's linear state is built at local positions; HYPIC places it at its segment's global
offset P as ``R(P) S`` (``RingLinearAttention.place``). This compares, against full recompute, the
composed prompt with the re-rotation and without it (``place`` replaced by the identity; attention
keys are re-rotated in both, so only the linear layers' states differ):

* layer 0 of an all-linear model (inputs token-local: exact with re-rotation) -> relative state error;
* the tiny hybrid model (3 Lightning-with-RoPE layers, 1 attention) in ``transition_rope`` (w = 0) and
  ``hypic`` (w = 8) -> relative error of the last linear layer's state, max |logit| error,
  KL(full || composed) of the next-token distribution, top-1 agreement.

    python benchmarks/rerotation.py --prompts 20 --segments 6 --seg-len 64
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypic_agent.runtime.hypic.build import build_entries
from hypic_agent.runtime.hypic.combine import combine
from hypic_agent.runtime.hypic.layout import plan_layout
from hypic_agent.runtime.hypic.modes import mode_spec, seam_tokens
from hypic_agent.runtime.models.hybrid import HybridForCausalLM, build_model
from hypic_agent.runtime.models.testing.tiny import random_state_dict, tiny_config
from hypic_agent.runtime.runner.standalone import prefill

CPU = torch.device("cpu")


def model(**overrides: Any) -> HybridForCausalLM:
    cfg = {**tiny_config("bailing_moe_linear"), **overrides}
    m = build_model(cfg)
    m.load_weights(random_state_dict(cfg, seed=0))
    return m


def composed(m: HybridForCausalLM, segs: list[tuple[int, ...]], suffix: list[int], mode: str, w: int, rerotate: bool):
    spec = mode_spec(mode)
    seams = [seam_tokens(w, len(s)) for s in segs]
    mixers = [layer.linear_attn for layer in m.layers if layer.linear_attn is not None]
    if not rerotate:
        for mx in mixers:
            mx.place = lambda S, offset: S  # type: ignore[method-assign]
    try:
        entries = build_entries(m, segs, seams)
        return combine(m, plan_layout(segs, entries, seams, suffix, CPU), entries, spec)
    finally:
        for mx in mixers:
            mx.__dict__.pop("place", None)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--segments", type=int, default=6)
    ap.add_argument("--seg-len", type=int, default=64)
    args = ap.parse_args()
    hybrid, linear = model(), model(layer_group_size=0)
    last_lin = hybrid.config.linear_layers[-1]
    rows: dict[str, list[float]] = {}

    def add(key: str, v: float) -> None:
        rows.setdefault(key, []).append(v)

    for p in range(args.prompts):
        g = torch.Generator().manual_seed(1000 + p)
        segs = [tuple(torch.randint(0, 256, (args.seg_len,), generator=g).tolist()) for _ in range(args.segments)]
        suffix = torch.randint(0, 256, (8,), generator=g).tolist()
        ids = [t for s in segs for t in s] + suffix
        ref_lin = prefill(linear, [ids])[0].layers[0].recurrent
        ref = prefill(hybrid, [ids])[0]
        p_ref = torch.softmax(ref.last_logits, -1)
        for rr in (True, False):
            tag = "rerotate" if rr else "skip"
            st = composed(linear, segs, suffix, "transition_rope", 0, rr)
            add(f"linear-only layer0 state rel err/{tag}", rel(st.layers[0].recurrent, ref_lin))
            for mode, w in (("transition_rope", 0), ("hypic", 8)):
                st = composed(hybrid, segs, suffix, mode, w, rr)
                key = f"{mode} w={w}"
                add(
                    f"{key} last linear state rel err/{tag}",
                    rel(st.layers[last_lin].recurrent, ref.layers[last_lin].recurrent),
                )
                add(f"{key} max |logit err|/{tag}", (st.last_logits - ref.last_logits).abs().max().item())
                logq = torch.log_softmax(st.last_logits, -1)
                add(f"{key} KL(full||composed)/{tag}", (p_ref * (p_ref.log() - logq)).sum().item())
                add(f"{key} top-1 agreement/{tag}", float(st.last_logits.argmax() == ref.last_logits.argmax()))
    out = {k: sum(v) / len(v) for k, v in rows.items()}
    print(f"{args.prompts} prompts x {args.segments} segments x {args.seg_len} tokens + 8 (means)")
    for k in sorted({k.rsplit("/", 1)[0] for k in out}):
        print(f"{k:50s} with {out[k + '/rerotate']:.3g}   without {out[k + '/skip']:.3g}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
