"""Shared fixtures: one tiny distillation run (tiny random Llama teacher, CPU) reused by the tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from hypic_agent.training.distill import DistillConfig, run_distill, tiny_config


@pytest.fixture(scope="package", autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny shapes: one intra-op thread is as fast and does not thrash on a shared, busy CPU
    (the tiny run took 53 s instead of 4 s with 2 threads under load). Restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_run_config(out: Path, **overrides: Any) -> DistillConfig:
    """Smaller than the --tiny preset: a few steps of 2 x 32 tokens."""
    base = dict(steps=6, batch=2, seq=32, warmup=2, eval_tokens=512, calib_tokens=256, ckpt_every=0, log_every=100)
    base.update(overrides)
    return tiny_config(out, **base)


@pytest.fixture(scope="package")
def tiny_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A token corpus built once (byte tokenizer, stdlib text)."""
    from hypic_agent.runtime.models.loading.tokenizer import tiny_tokenizer
    from hypic_agent.training.data import CorpusSpec, build_corpus, builtin_texts

    folder = tmp_path_factory.mktemp("corpus")
    docs = [("python", d) for d in builtin_texts(n_files=4, limit=8000, piece=1000)]
    build_corpus(CorpusSpec(eval_fraction=0.15), tiny_tokenizer(), folder, docs=docs, log=lambda s: None)
    return folder


@pytest.fixture(scope="package")
def tiny_run(tmp_path_factory: pytest.TempPathFactory, tiny_corpus: Path) -> tuple[DistillConfig, dict[str, Any]]:
    """One finished tiny distillation: (config, summary); the model is in ``cfg.out / 'model'``."""
    torch.manual_seed(0)
    cfg = tiny_run_config(tmp_path_factory.mktemp("run"), data=tiny_corpus, steps=12, lr=1e-2)
    return cfg, run_distill(cfg, log=lambda s: None)
