"""Two configs of one ``quality.py`` run head to head, with their recompute fractions.

    python benchmarks/quality_pair.py docs/results/quality_smollm2_auto_hotpotqa.json \\
        docs/results/quality_smollm2_auto_nq.json --a "hypic w=8" --b "hypic auto b=0.05"

Per dataset, a markdown row per config: n, recompute fraction, first-token KL and gold-NLL loss
against ``full_recompute`` (95% bootstrap intervals over examples), then the paired difference
``b - a`` of both (negative: ``b`` loses less) and the ratio of their mean losses.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from quality import mean_ci, paired_ci


def _ci(v: list[float] | None) -> str:
    return f"[{v[0]:+.3f}, {v[1]:+.3f}]" if v else "-"


def _loss(full: dict[str, Any], row: dict[str, Any]) -> list[float]:
    """Per-example gold-NLL loss against full_recompute (pairs with a NaN dropped)."""
    pe_f, pe_r = full["per_example"]["nll"], row["per_example"]["nll"]
    return [b - a for a, b in zip(pe_f, pe_r, strict=False) if a == a and b == b]


def table(rows: list[dict[str, Any]], a: str, b: str) -> list[str]:
    out = [
        "| dataset | config | n | recompute | first-token KL [95% CI] | gold-NLL loss [95% CI] |",
        "|---|---|---|---|---|---|",
    ]
    pairs = []
    for ds in dict.fromkeys(r["dataset"] for r in rows):
        by = {r["config"]: r for r in rows if r["dataset"] == ds}
        full = by["full_recompute"]
        for label in (a, b):
            r = by[label]
            kl, loss = r["per_example"]["kl"], _loss(full, r)
            out.append(
                f"| {ds} | {label} | {len(kl)} | {r['recompute']:.4f} | {sum(kl) / len(kl):.4f} {_ci(mean_ci(kl))} "
                f"| {sum(loss) / len(loss):+.4f} {_ci(mean_ci(loss))} |"
            )
        ka, kb = by[a]["per_example"]["kl"], by[b]["per_example"]["kl"]
        la, lb = _loss(full, by[a]), _loss(full, by[b])
        pairs.append(
            f"| {ds} | {len(kb)} | {sum(kb) / sum(ka):.2f} | {_ci(paired_ci(ka, kb))} "
            f"| {sum(lb) / sum(la):.2f} | {_ci(paired_ci(la, lb))} |"
        )
    head = [
        "",
        "| dataset | n | KL ratio b/a | KL b - a [95% CI] | gold-NLL loss ratio b/a | loss b - a [95% CI] |",
        "|---|---|---|---|---|---|",
    ]
    return out + head + pairs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--a", default="hypic w=8")
    ap.add_argument("--b", default="hypic auto b=0.05")
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    for f in args.files:
        rows += json.loads(f.read_text())["rows"]
    print("\n".join(table(rows, args.a, args.b)))


if __name__ == "__main__":
    main()
