"""Does cached prefill keep the answers? Every mode and seam width on identical prompt tokens.

    python benchmarks/quality.py --model smollm2-135m-instruct --datasets hotpotqa --limit 100 --gen-tokens 0
    python benchmarks/quality.py --model smollm2-135m-instruct --datasets hotpotqa nq kv multinews --limit 30
    python benchmarks/quality.py --model tiny:qwen3_5_text --smoke          # CI plumbing check

Each prompt is ``[system][doc 1]..[doc n][question]`` with documents shuffled per example.
Against ``full_recompute`` on the same tokens: first-token KL(full || mode), top-1 agreement
of the first token, the task score (F1 / EM / ROUGE-L x 100) of a greedy answer, and the mean
NLL of the reference answer teacher-forced after the prompt (``gold_nll``, nats/token): the
low-noise answer signal where a small model's task scores sit at the floor. Every config also
reports its recompute fraction (``recompute``): the share of the prompt's segment tokens (the
suffix left out) computed in context rather than served from an entry (1 for ``full_recompute``;
seams and segments too short to cache for the composed modes), so budgets compare fairly.

    python benchmarks/quality.py --datasets hotpotqa nq --limit 100 --gen-tokens 0 --modes hypic --seams \
        --auto-budgets 0.03 --data ../shared/data       # hypic w=8 vs seam="auto" at a 3% budget
    python benchmarks/quality.py --datasets hotpotqa nq --limit 100 --gen-tokens 0 --modes hypic --seams \
        --blend-budgets 0.05 --data ../shared/data      # vs seam="blend": scattered body recompute
    python benchmarks/quality.py --datasets hotpotqa --limit 20 --gen-tokens 0 --modes hypic --seams 1 \
        --build-prefixes bos template --data ../shared/data   # entries built after a context (sink prefix)

``--build-prefixes``: every fixed-seam ``hypic`` row again with its entries built after that
context (``Settings.build_prefix``, label ``... ctx=<name>``). The context's tokens are computed at
build time, once per entry, not per request: ``recompute`` does not count them. ``document`` carries
the dataset's system prompt (``Settings.build_system_prompt``), as a deployment configures its own;
``--build-system-prompt empty`` leaves it empty, as a server started without it runs.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from _common import print_table, pyplot, save_figure, write_json
from quality_data import DATA, DATASETS, Example, score

from hypic_agent.config import Settings
from hypic_agent.runtime.decode import decode_loop
from hypic_agent.runtime.engine import Engine
from hypic_agent.runtime.loader import load_engine
from hypic_agent.runtime.results import FinishEvent
from hypic_agent.runtime.runner.standalone import prefill
from hypic_agent.runtime.sampling import SamplingParams
from hypic_agent.segments.prompt.keys import KeyContext
from hypic_agent.segments.prompt.kinds import Segment
from hypic_agent.segments.prompt.plan import PromptPlan, build_plan

# prefix_cache is not compared: it is exact by construction (the scheduler's tests check it against
# full_recompute) and is served only through the scheduler's radix cache
MODE_CONFIGS = [("addition", 0.0), ("transition", 0.0), ("transition_rope", 0.0), ("hypic", 8.0)]
SEAM_ABLATION = [0.0, 4.0, 16.0, 32.0]


def configs(
    seams: list[float],
    modes: list[str] | None = None,
    budgets: list[float] | None = None,
    blend: list[float] | None = None,
    contexts: list[str] | None = None,
) -> list[tuple[str, str, float | str]]:
    """(label, mode, seam) per compared config; ``modes`` restricts the mode ladder (seam ablation
    rows are hypic runs and come with ``hypic``); ``budgets``: ``seam="auto"`` rows (label
    ``hypic auto b=<budget>``), ``blend``: ``seam="blend"`` rows (``hypic blend b=<budget>``),
    whatever the modes; ``contexts``: the fixed-seam, auto and blend hypic rows again per build context
    (label ``... ctx=<name>``)."""
    keep = [(m, w) for m, w in MODE_CONFIGS if modes is None or m in modes]
    out: list[tuple[str, str, float | str]] = [(m if m != "hypic" else f"hypic w={w:g}", m, w) for m, w in keep]
    if modes is None or "hypic" in modes:
        out += [(f"hypic w={w:g}", "hypic", w) for w in seams if w != 8.0]
    fixed = [c for c in out if c[1] == "hypic"]
    out += [(f"{lab} ctx={ctx}", m, w) for ctx in contexts or [] if ctx != "none" for lab, m, w in fixed]
    adaptive: list[tuple[str, str, float | str]] = [(f"hypic auto b={b:g}", "hypic", "auto") for b in budgets or []]
    adaptive += [(f"hypic blend b={b:g}", "hypic", "blend") for b in blend or []]
    with_ctx = [(f"{lab} ctx={ctx}", m, w) for ctx in contexts or [] if ctx != "none" for lab, m, w in adaptive]
    return out + adaptive + with_ctx


def recompute_fraction(engine: Engine, plan: PromptPlan, mode: str, seam: float | str) -> float:
    """Share of the prompt's segment tokens computed in context (see module doc)."""
    if mode == "full_recompute":
        return 1.0
    p = engine.pieces(plan, mode=mode, seam=seam)
    seams, keys, blend = engine.seam_plan(p, "default")
    total = sum(len(s) for s in p.segs)
    whole = sum(len(s) for s, k in zip(p.segs, keys, strict=True) if k is None)
    if blend is not None:  # seams, picked body tokens and the scout (token equivalents)
        return (whole + blend.recomputed([k is not None for k in keys])) / max(1, total)
    return (whole + sum(w for w, k in zip(seams, keys, strict=True) if k is not None)) / max(1, total)


def budget_of(label: str) -> float | None:
    """The seam budget of an ``auto`` / ``blend`` config label (None for the others)."""
    return float(label.split("b=")[1].split()[0]) if " auto b=" in label or " blend b=" in label else None


def context_of(label: str) -> str:
    """The build context of a config label (``Settings.build_prefix``; ``none`` without ``ctx=``)."""
    return label.split(" ctx=")[1] if " ctx=" in label else "none"


def make_plan(engine: Engine, ex: Example) -> PromptPlan:
    segs = [Segment(kind="system", text=ex.system)]
    segs += [Segment(kind="document", text=text, title=title) for title, text in ex.docs]
    return build_plan(segs, ex.question, engine.tokenizer, KeyContext(engine.fingerprint))


def kl_top1(ref: torch.Tensor, got: torch.Tensor) -> tuple[float, float]:
    p, q = torch.log_softmax(ref.float(), -1), torch.log_softmax(got.float(), -1)
    return float((p.exp() * (p - q)).sum()), float(ref.argmax() == got.argmax())


def answer(engine: Engine, prep: Any, tokens: int) -> str:
    params = SamplingParams(max_tokens=tokens, temperature=0.0, stop=("\n\n",))
    text = ""
    for ev in decode_loop(engine, prep, params, time.perf_counter()):
        if isinstance(ev, FinishEvent):
            text = ev.text
    return text.strip()


GOLD_TOKENS = 32  # teacher-forced tokens of the reference answer


def gold_nll(engine: Engine, prep: Any, ex: Example) -> float:
    """Mean NLL (nats/token) of the first reference answer, teacher-forced after the prompt state:
    a low-noise answer-quality signal for models too small to score well on F1 / EM / ROUGE."""
    ids = engine.tokenizer.encode(ex.answers[0], add_special_tokens=False)[:GOLD_TOKENS] if ex.answers else []
    if not ids:
        return float("nan")
    st = prep.state
    out = prefill(engine.model, [ids], [st], all_logits=True)[0]  # a new state: st stays usable
    logits = torch.cat([st.last_logits[None].float(), out.all_logits[:-1].float()])  # type: ignore[attr-defined]
    return float(F.cross_entropy(logits, torch.tensor(ids, device=logits.device)))


def run_dataset(
    engine: Engine,
    name: str,
    examples: list[Example],
    cfgs: list[tuple[str, str, float | str]],
    gen_tokens: int,
    on_progress: Any = None,
    every: int = 10,
    system_in_context: bool = True,
) -> list[dict[str, Any]]:
    """Every config on every example; ``on_progress(rows)`` gets the rows so far every ``every`` examples.
    ``system_in_context``: ``ctx=document`` builds carry the example's system prompt (else an empty one)."""
    acc: dict[str, dict[str, list[float]]] = {
        lab: {"kl": [], "top1": [], "score": [], "nll": [], "recompute": []}
        for lab in ["full_recompute", *(c[0] for c in cfgs)]
    }
    for i, ex in enumerate(examples):
        plan = make_plan(engine, ex)
        full = engine.prepare(plan, mode="full_recompute")
        assert full.state.last_logits is not None
        ref = full.state.last_logits.clone()
        acc["full_recompute"]["nll"].append(gold_nll(engine, full, ex))
        acc["full_recompute"]["recompute"].append(1.0)
        if gen_tokens:
            acc["full_recompute"]["score"].append(score(ex, answer(engine, full, gen_tokens)))
        for label, mode, w in cfgs:
            if (b := budget_of(label)) is not None:
                engine.settings.seam_budget = b
            engine.settings.build_prefix = context_of(label)  # type: ignore[assignment]
            # ctx=document: the app's system prompt, configured (or left empty)
            engine.settings.build_system_prompt = ex.system if system_in_context else ""
            acc[label]["recompute"].append(recompute_fraction(engine, plan, mode, w))
            prep = engine.prepare(plan, mode=mode, seam=w)
            assert prep.state.last_logits is not None
            kl, top1 = kl_top1(ref, prep.state.last_logits)
            acc[label]["kl"].append(kl)
            acc[label]["top1"].append(top1)
            acc[label]["nll"].append(gold_nll(engine, prep, ex))
            if gen_tokens:
                acc[label]["score"].append(score(ex, answer(engine, prep, gen_tokens)))
        print(f"{name} {i + 1}/{len(examples)} ({full.prompt_tokens} tokens)", flush=True)
        if on_progress is not None and (i + 1) % every == 0:
            on_progress(summarize(name, acc, i + 1, gen_tokens))
    return summarize(name, acc, len(examples), gen_tokens)


def summarize(name: str, acc: dict[str, dict[str, list[float]]], n: int, gen_tokens: int) -> list[dict[str, Any]]:
    """One row per config: means, deltas to ``full_recompute`` and their paired 95% intervals."""
    base = sum(acc["full_recompute"]["score"]) / max(1, len(acc["full_recompute"]["score"]))
    base_nll = sum(acc["full_recompute"]["nll"]) / max(1, len(acc["full_recompute"]["nll"]))
    rows = []
    full = acc["full_recompute"]
    for label, vals in acc.items():
        mean = {k: (sum(v) / len(v) if v else float("nan")) for k, v in vals.items()}
        rows.append(
            {
                "dataset": name,
                "config": label,
                "n": n,
                "score": mean["score"],
                "delta_vs_full": mean["score"] - base if gen_tokens else float("nan"),
                "kl_first_token": 0.0 if label == "full_recompute" else mean["kl"],
                "top1_agreement": 1.0 if label == "full_recompute" else mean["top1"],
                "gold_nll": mean["nll"],
                "gold_nll_delta": mean["nll"] - base_nll,
                "recompute": mean["recompute"],
                "delta_ci95": paired_ci(full["score"], vals["score"]),
                "gold_nll_delta_ci95": paired_ci(full["nll"], vals["nll"]),
                "kl_ci95": mean_ci(vals["kl"]) if label != "full_recompute" else None,
                "per_example": {k: list(v) for k, v in vals.items()},
            }
        )
    return rows


def paired_ci(base: list[float], other: list[float], iters: int = 2000, seed: int = 0) -> list[float] | None:
    """95% paired-bootstrap interval of ``mean(other - base)`` over examples (None without data)."""
    pairs = [(a, b) for a, b in zip(base, other, strict=False) if a == a and b == b]  # drop NaNs
    if not pairs:
        return None
    d = torch.tensor([b - a for a, b in pairs], dtype=torch.float64)
    g = torch.Generator().manual_seed(seed)
    means = d[torch.randint(0, len(d), (iters, len(d)), generator=g)].mean(1)
    return [float(means.quantile(0.025)), float(means.quantile(0.975))]


def mean_ci(vals: list[float], iters: int = 2000, seed: int = 0) -> list[float] | None:
    """95% bootstrap interval of ``mean(vals)`` (None without data)."""
    return paired_ci([0.0] * len(vals), vals, iters, seed)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for ds in sorted({r["dataset"] for r in rows}):
        seam = sorted(
            (float(r["config"].split("=")[1]), r["kl_first_token"])
            for r in rows
            if r["dataset"] == ds and r["config"].startswith("hypic w=") and " ctx=" not in r["config"]
        )
        axes[0].plot([s for s, _ in seam], [k for _, k in seam], marker="o", label=ds)
        keep = [r for r in rows if r["dataset"] == ds]
        modes = [r for r in keep if not r["config"].startswith("hypic w=") or r["config"] == "hypic w=8"]
        axes[1].bar([f"{ds}\n{r['config']}" for r in modes], [r["kl_first_token"] for r in modes])
        axes[2].bar([f"{ds}\n{r['config']}" for r in modes], [r.get("gold_nll_delta", 0.0) for r in modes])
    axes[0].set_xlabel("seam width w (tokens)")
    axes[0].set_ylabel("first-token KL(full || hypic)")
    axes[0].legend()
    axes[1].set_ylabel("first-token KL vs full_recompute")
    axes[1].tick_params(axis="x", labelrotation=70, labelsize=6)
    axes[2].set_ylabel("gold-answer NLL - full_recompute (nats/token)")
    axes[2].tick_params(axis="x", labelrotation=70, labelsize=6)
    save_figure(fig, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--limit", type=int, default=30)
    ap.add_argument("--gen-tokens", type=int, default=24, help="0 = fidelity only (no task score)")
    ap.add_argument("--seams", type=float, nargs="*", default=SEAM_ABLATION)
    ap.add_argument(
        "--modes", nargs="+", default=None, choices=[m for m, _ in MODE_CONFIGS],
        help="compare only these modes with full_recompute (default: all); large-n runs use --modes hypic --seams",
    )  # fmt: skip
    ap.add_argument(
        "--auto-budgets", type=float, nargs="*", default=[],
        help='seam="auto" rows at these recompute budgets (Settings.seam_budget)',
    )  # fmt: skip
    ap.add_argument(
        "--blend-budgets", type=float, nargs="*", default=[],
        help='seam="blend" rows (seams and scattered body tokens) at these recompute budgets',
    )  # fmt: skip
    ap.add_argument(
        "--build-prefixes", nargs="*", default=[], choices=["none", "bos", "template", "document"],
        help="fixed-seam hypic rows again with entries built after this context (Settings.build_prefix)",
    )  # fmt: skip
    ap.add_argument(
        "--build-system-prompt", choices=["dataset", "empty"], default="dataset",
        help="ctx=document: the dataset's system prompt in the context (as configured) or none (the default)",
    )  # fmt: skip
    ap.add_argument(
        "--only", nargs="*", default=[],
        help="keep only these config labels (and full_recompute), e.g. 'hypic auto b=0.06 ctx=document'",
    )  # fmt: skip
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip", type=int, default=0, help="leave out the first N examples (shard a long run)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (shared machines: 1)")
    ap.add_argument("--write-every", type=int, default=10, help="write the partial JSON every N examples")
    ap.add_argument("--smoke", action="store_true", help="2 examples, 4 tokens: plumbing only")
    ap.add_argument("--out", default="bench_out/quality.json")
    ap.add_argument("--plot", default=None, help="PNG path (default: next to --out)")
    args = ap.parse_args()
    if not args.data.is_dir():
        raise SystemExit(f"no evaluation data at {args.data}: pass --data ../shared/data")
    torch.set_num_threads(max(1, args.threads))
    if args.smoke:
        args.limit, args.gen_tokens = min(args.limit, 2), 4
    engine = load_engine(
        Settings(device="cpu" if not torch.cuda.is_available() else "auto", min_cached_tokens=16), model=args.model
    )
    cfgs = configs(args.seams, args.modes, args.auto_budgets, args.blend_budgets, args.build_prefixes)
    if args.only:
        unknown = sorted(set(args.only) - {c[0] for c in cfgs})
        if unknown:
            raise SystemExit(f"--only: no such config {unknown}; the options give {[c[0] for c in cfgs]}")
        cfgs = [c for c in cfgs if c[0] in args.only]
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()

    def partial(part: list[dict[str, Any]]) -> None:
        """The finished datasets' rows plus the running one's so far (``rows`` grows after each)."""
        write_json(args.out, {"model": engine.name, "args": vars(args), "rows": rows + part, "partial": True})

    for ds in args.datasets:
        examples = DATASETS[ds](args.data, args.limit, args.seed)[args.skip :]
        if args.smoke:  # byte-level tiny tokenizers: keep prompts inside the tiny context
            for ex in examples:
                ex.docs = [(t, x[:200]) for t, x in ex.docs[:4]]
        every, sys_ctx = max(1, args.write_every), args.build_system_prompt == "dataset"
        rows += run_dataset(engine, ds, examples, cfgs, args.gen_tokens, partial, every, sys_ctx)
        partial([])
    cols = ["dataset", "config", "n", "score", "delta_vs_full", "kl_first_token", "top1_agreement"]
    print_table(rows, [*cols, "gold_nll", "gold_nll_delta", "recompute"])
    write_json(
        args.out,
        {
            "model": engine.name,
            "fingerprint": engine.fingerprint,
            "args": vars(args),
            "rows": rows,
            "seconds": time.perf_counter() - t0,
        },
    )
    plot(rows, Path(args.plot) if args.plot else Path(args.out).with_suffix(".png"))


if __name__ == "__main__":
    main()
