"""Where does cached prefill deviate? Per-token deviation of ``hypic`` from ``full_recompute`` by
offset inside a segment and by the segment's index.

    python benchmarks/deviation.py --model smollm2-135m-instruct --limit 25 --data ../shared/data

Prompts as in ``quality.py`` (``[system][doc 1]..[doc n][question]``, documents shuffled). For
every prompt token the *composed* representation is what the ``hypic`` forward works with: a body
token (cached) has the hidden states of its segment's isolated prefill, which is what its entry's
keys / values (and a hybrid's pairs) were computed from; an active token (seam window, suffix,
short segment) has the rows the composed forward recomputes in context. ``runtime.hypic.probe``
gives both (the combine forward keeping every row; one segment alone with no entry is its isolated
prefill) and the one-pass rows of ``full_recompute``. Per token:

* ``kl``: KL(full || composed) of the token's next-token distribution (the logits of its row);
* ``rel_err[l]``: ``|h_composed - h_full| / |h_full|`` of the residual entering layer ``l`` (the
  input of layer ``l``'s keys / values), and after the last layer.

Buckets: offset inside the segment (0, 1, 2, 3, 4-7, ..., 256+), segment index (0 = the system
prompt, right after BOS where the tokenizer adds one) and the suffix. Only cached segments are
bucketed by offset (uncached ones are recomputed whole).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch
from _common import print_table, pyplot, save_figure, write_json
from quality import make_plan
from quality_data import DATA, DATASETS

from hypic_agent.config import Settings
from hypic_agent.runtime.engine import Engine
from hypic_agent.runtime.hypic.build import build_entries
from hypic_agent.runtime.hypic.layout import plan_layout
from hypic_agent.runtime.hypic.modes import mode_spec
from hypic_agent.runtime.hypic.probe import probe
from hypic_agent.runtime.loader import load_engine

EDGES = [0, 1, 2, 3, 4, 8, 16, 32, 64, 128, 256]


def bucket(offset: int) -> str:
    """Offset inside a segment -> its bucket label (``0``, ``4-7``, ``256+``)."""
    i = max(j for j, e in enumerate(EDGES) if offset >= e)
    if i == len(EDGES) - 1:
        return f"{EDGES[i]}+"
    lo, hi = EDGES[i], EDGES[i + 1] - 1
    return str(lo) if lo == hi else f"{lo}-{hi}"


def token_kl(ref: torch.Tensor, got: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """Row-wise KL(softmax(ref) || softmax(got)) ``[T]``, in chunks (vocab-wide rows)."""
    out = []
    for a in range(0, ref.shape[0], chunk):
        p, q = torch.log_softmax(ref[a : a + chunk].float(), -1), torch.log_softmax(got[a : a + chunk].float(), -1)
        out.append((p.exp() * (p - q)).sum(-1))
    return torch.cat(out)


class Acc:
    """Sums per (seam, bucket): tokens, KL and per-layer relative error."""

    def __init__(self) -> None:
        self.n: dict[tuple[str, str], int] = {}
        self.kl: dict[tuple[str, str], float] = {}
        self.err: dict[tuple[str, str], torch.Tensor] = {}

    def add(self, key: tuple[str, str], kl: torch.Tensor, err: torch.Tensor) -> None:
        """``kl [T]``, ``err [n_layers + 1, T]`` of the tokens of one bucket."""
        if kl.numel() == 0:
            return
        self.n[key] = self.n.get(key, 0) + kl.numel()
        self.kl[key] = self.kl.get(key, 0.0) + float(kl.sum())
        self.err[key] = self.err.get(key, 0) + err.sum(1).double()

    def rows(self) -> list[dict[str, Any]]:
        out = []
        for (w, b), n in self.n.items():
            e = (self.err[(w, b)] / n).tolist()
            out.append({"seam": w, "bucket": b, "tokens": n, "kl": self.kl[(w, b)] / n, "rel_err": e})
        return out


@torch.no_grad()
def measure(engine: Engine, plan: Any, seams_w: list[float], acc_off: Acc, acc_seg: Acc) -> int:
    """One prompt: the one pass, each cached segment's isolated prefill, and the composed forward at
    every seam width in ``seams_w``; adds every token's deviation to the accumulators."""
    model, dev = engine.model, engine.device
    spec = mode_spec("hypic")
    base = engine.pieces(plan, mode="hypic", seam=0)
    segs, suffix = base.segs, base.suffix
    n = len(segs)
    starts = [sum(len(s) for s in segs[:i]) for i in range(n + 1)]
    full = probe(model, plan_layout(segs, [None] * n, [0] * n, suffix, dev), [None] * n, spec)
    iso: dict[int, Any] = {}  # isolated prefill of every cacheable segment (independent of the seam)
    for w in seams_w:
        p = engine.pieces(plan, mode="hypic", seam=w)
        seams, keys = engine.seams_and_keys(p, "default")
        cached = [i for i, k in enumerate(keys) if k is not None]
        for i in cached:
            if i not in iso:
                iso[i] = probe(model, plan_layout([segs[i]], [None], [0], [], dev), [None], spec)
        built = build_entries(model, [segs[i] for i in cached], [seams[i] for i in cached]) if cached else []
        entries: list[Any] = [None] * n
        for i, e in zip(cached, built, strict=True):
            entries[i] = e
        comp = probe(model, plan_layout(segs, entries, seams, suffix, dev), entries, spec)
        # composed rows over the whole prompt: isolated rows for bodies, recomputed rows elsewhere
        hidden, logits = full.hidden.clone(), full.logits.clone()  # type: ignore[union-attr]
        for i in cached:
            a, b = starts[i] + seams[i], starts[i + 1]
            hidden[:, a:b] = iso[i].hidden[:, seams[i] :]
            logits[a:b] = iso[i].logits[seams[i] :]
        hidden[:, comp.positions] = comp.hidden
        logits[comp.positions] = comp.logits  # type: ignore[index]
        kl = token_kl(full.logits, logits)  # type: ignore[arg-type]
        err = (hidden - full.hidden).norm(dim=-1) / full.hidden.norm(dim=-1).clamp_min(1e-6)
        tag = f"w={w:g}"
        for i in cached:
            offs = torch.arange(len(segs[i]))
            labels = [bucket(int(o)) for o in offs]
            for lab in dict.fromkeys(labels):
                sel = torch.tensor([j for j, x in enumerate(labels) if x == lab]) + starts[i]
                acc_off.add((tag, lab), kl[sel], err[:, sel])
        for i in range(n):
            if base.kinds[i] == "bos":
                continue
            a, b = starts[i], starts[i + 1]
            acc_seg.add((tag, f"seg {i - int(base.kinds[0] == 'bos')}"), kl[a:b], err[:, a:b])
        acc_seg.add((tag, "suffix"), kl[starts[n] :], err[:, starts[n] :])
    return starts[n] + len(suffix)


def plot(off: list[dict[str, Any]], seg: list[dict[str, Any]], n_layers: int, path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.5))
    order = [bucket(e) for e in EDGES]
    for w in sorted({r["seam"] for r in off}):
        rs = sorted((r for r in off if r["seam"] == w), key=lambda r: order.index(r["bucket"]))
        axes[0].plot([r["bucket"] for r in rs], [r["kl"] for r in rs], marker="o", label=w)
        for li in (n_layers // 4, n_layers // 2, n_layers):
            axes[1].plot([r["bucket"] for r in rs], [r["rel_err"][li] for r in rs], marker=".", label=f"{w} layer {li}")
        ss = [r for r in seg if r["seam"] == w]
        axes[2].plot([r["bucket"].replace("seg ", "") for r in ss], [r["kl"] for r in ss], marker="o", label=w)
    axes[0].set_xlabel("offset inside the segment")
    axes[0].set_ylabel("next-token KL(full || cached), mean per token")
    axes[0].set_yscale("log")
    axes[1].set_xlabel("offset inside the segment")
    axes[1].set_ylabel("hidden-state relative error")
    axes[1].set_yscale("log")
    axes[2].set_xlabel("segment index (0 = system prompt)")
    axes[2].set_ylabel("next-token KL, mean per token")
    for ax in axes:
        ax.legend(fontsize=7)
        ax.tick_params(axis="x", labelrotation=45)
    save_figure(fig, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--dataset", default="hotpotqa", choices=list(DATASETS))
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--limit", type=int, default=25)
    ap.add_argument("--seams", type=float, nargs="+", default=[0.0, 8.0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-minutes", type=float, default=0, help="stop after the example that passes this (0: never)")
    ap.add_argument("--out", default="bench_out/deviation.json")
    ap.add_argument("--plot", default=None, help="PNG path (default: next to --out)")
    args = ap.parse_args()
    engine = load_engine(
        Settings(device="cpu" if not torch.cuda.is_available() else "auto", min_cached_tokens=16), model=args.model
    )
    acc_off, acc_seg = Acc(), Acc()
    t0 = time.perf_counter()
    done = 0
    for i, ex in enumerate(DATASETS[args.dataset](args.data, args.limit, args.seed)):
        tokens = measure(engine, make_plan(engine, ex), args.seams, acc_off, acc_seg)
        done = i + 1
        print(f"{done}/{args.limit} ({tokens} tokens, {time.perf_counter() - t0:.0f} s)", flush=True)
        if args.max_minutes and time.perf_counter() - t0 > 60 * args.max_minutes:
            break
    n_layers = len(engine.model.layers)
    off, seg = acc_off.rows(), acc_seg.rows()
    show = (1, n_layers // 2, n_layers)
    for rows in (off, seg):
        for r in rows:
            r |= {f"err_l{li}": r["rel_err"][li] for li in show} | {"err_mean": sum(r["rel_err"][1:]) / n_layers}
        print_table(rows, ["seam", "bucket", "tokens", "kl", *(f"err_l{li}" for li in show), "err_mean"])
    meta = {
        "model": engine.name,
        "dataset": args.dataset,
        "n": done,
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    write_json(
        args.out,
        {**meta, "n_layers": n_layers, "by_offset": off, "by_segment": seg, "seconds": time.perf_counter() - t0},
    )
    plot(off, seg, n_layers, Path(args.plot) if args.plot else Path(args.out).with_suffix(".png"))


if __name__ == "__main__":
    main()
