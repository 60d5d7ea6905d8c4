"""Compare ``quality.py`` results of several models side by side: a markdown table and a plot.

    python benchmarks/quality_compare.py \
        --run "distilled=docs/results/quality_hybrid_gpu_hotpotqa.json,docs/results/quality_hybrid_gpu_nq.json" \
        --run "cached-trained=docs/results/quality_hybrid_cached_hotpotqa.json,..." \
        --config "hypic w=8" --out docs/results/quality_hybrid_cached.png

For one config (default ``hypic w=8``) and every dataset: the task-score difference to
``full_recompute`` and the gold-answer NLL difference, each with its paired 95% interval.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from _common import save_figure


def load(spec: str) -> tuple[str, list[dict[str, Any]]]:
    label, _, files = spec.partition("=")
    if not files:
        raise SystemExit(f"--run takes LABEL=FILE[,FILE...], got {spec!r}")
    rows: list[dict[str, Any]] = []
    for f in files.split(","):
        rows += json.loads(Path(f).read_text())["rows"]
    return label, rows


def table(runs: list[tuple[str, list[dict[str, Any]]]], config: str) -> list[str]:
    def ci(v: list[float] | None, fmt: str) -> str:
        return f"[{v[0]:{fmt}}, {v[1]:{fmt}}]" if v else "-"

    out = [
        "| model | dataset | n | full score | cached score | delta [95% CI] | first-token KL | top-1 "
        "| gold NLL delta [95% CI] |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, rows in runs:
        full = {r["dataset"]: r for r in rows if r["config"] == "full_recompute"}
        for r in rows:
            if r["config"] != config:
                continue
            f = full[r["dataset"]]
            out.append(
                f"| {label} | {r['dataset']} | {r['n']} | {f['score']:.2f} | {r['score']:.2f} | "
                f"{r['delta_vs_full']:+.2f} {ci(r['delta_ci95'], '+.1f')} | {r['kl_first_token']:.3f} | "
                f"{r['top1_agreement']:.2f} | {r['gold_nll_delta']:+.3f} {ci(r['gold_nll_delta_ci95'], '+.3f')} |"
            )
    return out


def plot(runs: list[tuple[str, list[dict[str, Any]]]], config: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    width = 0.8 / len(runs)
    for j, (label, rows) in enumerate(runs):
        sel = [r for r in rows if r["config"] == config]
        xs = [i + j * width for i in range(len(sel))]
        for ax, key, ci_key in (
            (axes[0], "delta_vs_full", "delta_ci95"),
            (axes[1], "gold_nll_delta", "gold_nll_delta_ci95"),
        ):
            vals = [r[key] for r in sel]
            lo = [r[key] - (r[ci_key] or [r[key]] * 2)[0] for r in sel]
            hi = [(r[ci_key] or [r[key]] * 2)[1] - r[key] for r in sel]
            ax.bar(xs, vals, width, yerr=[lo, hi], capsize=3, label=label)
            ax.set_xticks([i + 0.4 - width / 2 for i in range(len(sel))], [r["dataset"] for r in sel])
    axes[0].axhspan(-1.0, 1.0, color="green", alpha=0.08, label="target: within 1.0 point")
    axes[0].set_ylabel(f"{config}: task score - full_recompute (x100)")
    axes[1].set_ylabel(f"{config}: gold-answer NLL - full_recompute (nats/token)")
    for ax in axes:
        ax.axhline(0, color="black", lw=0.6)
        ax.legend(fontsize=8)
    save_figure(fig, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--run", action="append", required=True, help="LABEL=FILE[,FILE...]")
    ap.add_argument("--config", default="hypic w=8")
    ap.add_argument("--out", type=Path, default=None, help="PNG path (none: table only)")
    args = ap.parse_args()
    runs = [load(s) for s in args.run]
    print("\n".join(table(runs, args.config)))
    if args.out is not None:
        plot(runs, args.config, args.out)


if __name__ == "__main__":
    main()
