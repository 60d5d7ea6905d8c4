"""The distillation loop on the tiny teacher: loss goes down, checkpoints resume exactly."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import load_file

from hypic_agent.training.distill import DistillConfig, run_distill
from hypic_agent.training.schedule import lr_at

from .conftest import tiny_run_config


def test_training_reduces_kl(tiny_run) -> None:
    cfg, summary = tiny_run
    first, last = summary["evals"][0], summary["evals"][-1]
    assert first["step"] == 0 and last["step"] == cfg.steps
    assert last["kl"] < 0.8 * first["kl"], (first, last)
    assert last["top1"] >= first["top1"]
    assert math.isclose(first["teacher_ppl"], last["teacher_ppl"])
    assert summary["history"][-1]["loss"] < summary["history"][0]["loss"]
    assert summary["gdn_backend"] == "torch" and summary["trainable_params"] > 0


def test_lr_schedule() -> None:
    cfg = DistillConfig(out=Path("."), steps=100, warmup=10, lr=1.0, min_lr_ratio=0.1)
    assert lr_at(cfg, 0) == 0.1 and lr_at(cfg, 9) == 1.0
    assert math.isclose(lr_at(cfg, 10), 1.0) and math.isclose(lr_at(cfg, 100), 0.1)
    assert lr_at(cfg, 30) > lr_at(cfg, 60) > lr_at(cfg, 90)


def test_resume_round_trip(tmp_path: Path, tiny_corpus: Path) -> None:
    """3 steps in two processes (stop at 1, resume) == 3 steps in one."""
    logs: list[str] = []
    one = tiny_run_config(tmp_path / "one", data=tiny_corpus, steps=3, hidden_weight=0.5)
    run_distill(one, log=lambda s: None)
    two = replace(one, out=tmp_path / "two", stop_at=1)
    run_distill(two, log=lambda s: None)
    state = json.loads((two.out / "ckpt" / "state.json").read_text())
    assert state["step"] == 1
    run_distill(replace(two, stop_at=None, resume=True), log=logs.append)
    assert not any("fresh" in line for line in logs)
    a = load_file(str(one.out / "ckpt" / "weights.safetensors"))
    b = load_file(str(two.out / "ckpt" / "weights.safetensors"))
    assert a.keys() == b.keys() and len(a) > 0
    for name in a:
        assert torch.allclose(a[name], b[name], atol=1e-6), name
    final = json.loads((two.out / "ckpt" / "state.json").read_text())
    assert final["step"] == 3 and [h["step"] for h in final["history"]][-1] == 3


def test_layer_local_steps_run(tmp_path: Path, tiny_corpus: Path) -> None:
    cfg = tiny_run_config(tmp_path, data=tiny_corpus, steps=2, local_steps=1, log_every=1, train="gdn")
    summary = run_distill(cfg, log=lambda s: None)
    hist = summary["history"]
    assert hist[0]["kl"] == 0.0 and hist[0]["hidden"] > 0  # layer-local phase: hidden loss only
    assert hist[-1]["kl"] > 0


def test_time_schedule_and_init_from(tiny_run, tmp_path: Path, tiny_corpus: Path) -> None:
    """--steps 0 --time-budget: cosine over time, stops on time; --init-from: starts from a model folder."""
    cfg0, _ = tiny_run
    timed = DistillConfig(out=Path("."), steps=0, time_budget_s=100.0, warmup=2, lr=1.0, min_lr_ratio=0.1)
    assert math.isclose(lr_at(timed, 5, 50.0), 0.55) and math.isclose(lr_at(timed, 5, 200.0), 0.1)
    cfg = tiny_run_config(tmp_path, data=tiny_corpus, steps=0, time_budget_s=1.0, init_from=cfg0.out / "model")
    summary = run_distill(cfg, log=lambda s: None)
    assert summary["steps_done"] >= 1 and summary["train_seconds"] < 30
    # starting from the trained model: its init metrics are the trained run's final ones
    assert math.isclose(summary["evals"][0]["kl"], run_eval_kl(cfg0), rel_tol=1e-3)


def run_eval_kl(cfg: DistillConfig) -> float:
    return json.loads((cfg.out / "model" / "distill.json").read_text())["evals"][-1]["kl"]


# A corpus of fixed text (not the stdlib's files, which differ between Python versions and moved
# this test's numbers): words drawn by a 31-bit LCG, the same on every machine.
_WORDS = (
    "the cache of a segment is built once and reused in any order by the model when a prompt lists "
    "documents skills memory and turns so each piece is prefilled alone then the state is composed "
    "with a seam of recomputed tokens at every boundary"
).split()


def _fixed_text(seed: int, n_words: int) -> str:
    x, out = seed, []
    for _ in range(n_words):
        x = (1103515245 * x + 12345) % 2**31
        out.append(_WORDS[(x >> 16) % len(_WORDS)])
    return " ".join(out)


def fixed_corpus(folder: Path) -> Path:
    from hypic_agent.runtime.models.loading.tokenizer import tiny_tokenizer
    from hypic_agent.training.data import CorpusSpec, build_corpus

    docs = [("synthetic", (f"doc{i}", _fixed_text(i, 180))) for i in range(60)]
    build_corpus(CorpusSpec(eval_fraction=0.15), tiny_tokenizer(), folder, docs=docs, log=lambda s: None)
    return folder


CACHED_STEPS = 24
CACHED_OPTS: dict = dict(cached_segment_lens=(6, 8), cached_seams=(1, 2), cached_min_suffix=8, cached_eval=(8, 2))


def cached_run(tmp_path: Path) -> tuple[DistillConfig, dict]:
    """24 cached-prefill steps from the converted student on the fixed corpus, one thread,
    deterministic algorithms: the same numbers on every machine and any OMP_NUM_THREADS."""
    data = fixed_corpus(tmp_path / "corpus")
    cfg = tiny_run_config(
        tmp_path / "run", data=data, steps=CACHED_STEPS, lr=3e-3, eval_tokens=1024, cached_every=1, log_every=1,
        **CACHED_OPTS,
    )  # fmt: skip
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        return cfg, run_distill(cfg, log=lambda s: None)
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


def test_cached_prefill_steps_lower_the_cached_kl(tmp_path: Path) -> None:
    """--cached-every 1: every step trains the student as the hypic mode serves it; the served
    (composed) KL to the teacher falls, and the plan of a step is a function of (seed, step).

    Measured (this corpus, seed 0, 1 or 2 threads, any OMP_NUM_THREADS): cached KL 0.1616 -> 0.0604
    (x0.374); on five other LCG corpora x0.32-0.45. The bound x0.6 leaves a wide margin and still
    fails when cached steps do not train (the KL stays near x1)."""
    from hypic_agent.training.schedule import cached_plan

    cfg, summary = cached_run(tmp_path)
    plans = [cached_plan(cfg, s) for s in range(CACHED_STEPS)]
    assert all(p is not None and p.total == cfg.seq and p.suffix_len >= 8 for p in plans)
    assert plans == [cached_plan(cfg, s) for s in range(CACHED_STEPS)] and len(set(plans)) > 1
    assert cached_plan(replace(cfg, cached_every=3), 0) is None and cached_plan(replace(cfg, cached_every=3), 2)
    first, last = summary["evals"][0], summary["evals"][-1]
    assert first["cached_tokens"] > 0 and all(h["cached"] for h in summary["history"])
    assert last["step"] == CACHED_STEPS and math.isfinite(last["cached_kl"])
    assert last["cached_kl"] < 0.6 * first["cached_kl"], (first, last)
