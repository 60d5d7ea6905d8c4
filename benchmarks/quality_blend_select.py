"""Which body tokens should ``seam="blend"`` recompute? Selectors compared at equal token counts.

    python benchmarks/quality_blend_select.py --datasets hotpotqa --limit 12 --data ../shared/data

Prompts as in ``quality.py``. Per prompt, every selector gets the token count ``hypic`` w=8
recomputes (``--mult`` times it), spends it on seams of 1 (the sink) plus body tokens of its
choice, and the composed forward's first-token KL(full || blend) is recorded. Selectors:

* ``oracle``: each body token's true deviation (its isolated rows vs the one pass, relative error
  averaged over layers): what a selector could know at best, token by token;
* ``cacheblend``: CacheBlend's signal, the layer-1 key + value deviation once layer 0 has run in
  context (charged: one layer for every token, ``1 / layers`` of the prompt);
* ``profile``: the build-time token profile (``blend.measure_tokens``: alone vs after a neutral
  context), free at the request;
* ``scout k=K``: attention mass the suffix gives each token over the first K layers (a forward of
  the seams and the suffix, charged: rows x K / layers) times its profile, ``BlendPlan.pick``'s
  score.

The one-pass rows and the isolated rows come from ``runtime.hypic.probe``; nothing here is on a
serving path.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from _common import print_table, write_json
from quality import kl_top1, make_plan
from quality_data import DATA, DATASETS

from hypic_agent.config import Settings
from hypic_agent.runtime.hypic.blend import measure_tokens
from hypic_agent.runtime.hypic.blend_scout import scout_mass
from hypic_agent.runtime.hypic.build import build_entries
from hypic_agent.runtime.hypic.combine import combine
from hypic_agent.runtime.hypic.layout import plan_layout
from hypic_agent.runtime.hypic.modes import mode_spec
from hypic_agent.runtime.hypic.probe import probe
from hypic_agent.runtime.loader import load_engine

SCOUTS = (4, 8, 15, 30)


@torch.no_grad()
def one(engine, ex, mults: list[float]) -> dict[str, float]:  # type: ignore[no-untyped-def]
    model, dev, spec = engine.model, engine.device, mode_spec("hypic")
    p = engine.pieces(make_plan(engine, ex), mode="hypic", seam=8)
    segs, suffix, n, n_layers = p.segs, p.suffix, len(p.segs), len(model.layers)
    seams8, keys = engine.seams_and_keys(p, "default")
    cached = [i for i, k in enumerate(keys) if k is not None]
    starts = [sum(len(s) for s in segs[:i]) for i in range(n + 1)]
    full = probe(model, plan_layout(segs, [None] * n, [0] * n, suffix, dev), [None] * n, spec, logits=False)
    ref = model.logits(full.hidden[-1, -1:])[0]
    entries: list = [None] * n
    for i, e in zip(cached, build_entries(model, [segs[i] for i in cached], [0] * len(cached)), strict=True):
        entries[i] = e
    sinks = [1 if i in cached and i > 0 else 0 for i in range(n)]
    ctx = engine.seam_profiles.context(engine.tokenizer)
    mass = scout_mass(model, plan_layout(segs, entries, sinks, suffix, dev), entries, len(suffix), max(SCOUTS))
    per_layer = {k: scout_mass(model, plan_layout(segs, entries, sinks, suffix, dev), entries, len(suffix), k)
                 for k in SCOUTS[:-1]}  # fmt: skip
    per_layer[max(SCOUTS)] = mass
    sig: dict[str, list[tuple[float, int, int]]] = {}
    for i in cached[1:] if cached and cached[0] == 0 else cached:
        a, b = starts[i], starts[i + 1]
        iso = probe(model, plan_layout([segs[i]], [None], [0], [], dev), [None], spec, logits=False).hidden.float()
        fh = full.hidden[:, a:b].float()
        oracle = ((iso - fh).norm(dim=-1) / fh.norm(dim=-1).clamp_min(1e-6))[1:].mean(0)
        xf, xi = model.layers[1].mixer_in(full.hidden[1, a:b]), model.layers[1].mixer_in(iso[1])
        kv = (xf[1] - xi[1]).flatten(1).norm(dim=-1) + (xf[2] - xi[2]).flatten(1).norm(dim=-1)
        prof = torch.tensor(measure_tokens(model, segs[i], ctx).dev)
        rows = {"oracle": oracle, "cacheblend": kv, "profile": prof}
        rows |= {f"scout k={k}": m[a:b] * prof for k, m in per_layer.items()}
        for name, v in rows.items():
            sig.setdefault(name, []).extend((-float(v[j]), i, j) for j in range(1, b - a))
    budget = sum(seams8[i] for i in cached)
    scout_rows = sum(sinks) + len(suffix)
    cost = {"cacheblend": sum(len(segs[i]) for i in cached) / n_layers}
    cost |= {f"scout k={k}": scout_rows * k / n_layers for k in SCOUTS}
    out = {
        "w=8": kl_top1(ref, combine(model, plan_layout(segs, entries, seams8, suffix, dev), entries, spec).last_logits)[
            0
        ]
    }
    for mult in mults:
        for name, cand in sig.items():
            left = int(budget * mult - sum(sinks) - cost.get(name, 0.0))
            pick = sorted(cand)[: max(0, left)]
            blend = [sorted(j for _, s, j in pick if s == i) for i in range(n)]
            st = combine(model, plan_layout(segs, entries, sinks, suffix, dev, blend), entries, spec)
            out[f"x{mult:g} {name}"] = kl_top1(ref, st.last_logits)[0]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--datasets", nargs="+", default=["hotpotqa"], choices=list(DATASETS))
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("--mult", type=float, nargs="+", default=[1.0], help="token counts, times w=8's")
    ap.add_argument("--out", default="bench_out/quality_blend_select.json")
    args = ap.parse_args()
    engine = load_engine(Settings(device="cpu" if not torch.cuda.is_available() else "auto"), model=args.model)
    rows = []
    for ds in args.datasets:
        acc: dict[str, list[float]] = {}
        for k, ex in enumerate(DATASETS[ds](args.data, args.limit, 0)):
            for name, v in one(engine, ex, args.mult).items():
                acc.setdefault(name, []).append(v)
            print(f"{ds} {k + 1}/{args.limit}", flush=True)
        rows += [{"dataset": ds, "selector": s, "n": len(v), "kl_first_token": sum(v) / len(v), "per_example": v}
                 for s, v in acc.items()]  # fmt: skip
        write_json(args.out, {"model": engine.name, "args": vars(args), "rows": rows})
    print_table(rows, ["dataset", "selector", "n", "kl_first_token"])


if __name__ == "__main__":
    main()
