"""Join ``quality.py`` runs of one model over consecutive example ranges into one result.

    python benchmarks/quality_merge.py part0.json part1.json ... --out merged.json

A long run can be sharded (``quality.py --skip K --limit N`` runs examples K..N-1; a run stopped
early leaves a partial JSON of its first n examples). Inputs must cover consecutive ranges of the
same dataset(s), model and configs, given in example order; the merged rows are recomputed from
the per-example values (means, deltas, paired bootstrap intervals), exactly as one run would be.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from _common import print_table, write_json
from quality import summarize


def merge(payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of the concatenated example ranges, per dataset (order of first appearance)."""
    acc: dict[str, dict[str, dict[str, list[float]]]] = {}
    counts: dict[str, int] = {}
    gen: dict[str, bool] = {}
    expected: dict[str, int] = {}
    for p in payloads:
        skip = int(p["args"].get("skip", 0))
        seen: set[str] = set()
        for row in p["rows"]:
            ds = row["dataset"]
            if ds not in seen:
                if expected.get(ds, 0) != skip:
                    raise SystemExit(f"{ds}: a part starts at example {skip}, expected {expected.get(ds, 0)}")
                expected[ds] = skip + int(row["n"])
                counts[ds] = counts.get(ds, 0) + int(row["n"])
                seen.add(ds)
            per = acc.setdefault(ds, {}).setdefault(row["config"], {})
            for k, v in row["per_example"].items():  # the keys quality.py records per example
                per.setdefault(k, []).extend(v)
            gen[ds] = bool(p["args"].get("gen_tokens", 0))
    rows: list[dict[str, Any]] = []
    for ds, by_cfg in acc.items():
        lens = {len(v["nll"]) for v in by_cfg.values()}
        if lens != {counts[ds]}:
            raise SystemExit(f"{ds}: configs cover different examples ({sorted(lens)})")
        rows += summarize(ds, by_cfg, counts[ds], int(gen[ds]))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("parts", nargs="+", type=Path)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    payloads = [json.loads(p.read_text()) for p in args.parts]
    models = {p["model"] for p in payloads}
    if len(models) != 1:
        raise SystemExit(f"parts come from different models: {sorted(models)}")
    rows = merge(payloads)
    cols = ["dataset", "config", "n", "score", "delta_vs_full", "kl_first_token", "top1_agreement"]
    print_table(rows, [*cols, "gold_nll", "gold_nll_delta", "recompute"])
    write_json(args.out, {"model": models.pop(), "parts": [str(p) for p in args.parts], "rows": rows})


if __name__ == "__main__":
    main()
