"""Prepare the bundle that takes the distillation to a GPU machine with no network.

``python -m hypic_agent.training.prepare --out .cache/distill`` (run in the repo root; ``.cache/`` is
git-ignored) writes:

* ``corpus/``: the token corpus (``data.build_corpus`` with the teacher tokenizer);
* ``base/<gguf>.part0``, ``.part1``: the teacher GGUF in two parts (the machine takes 64 MiB per call);
* ``whl/``: cp312 wheels of what the GPU image lacks (pydantic family, gguf), same versions as here;

and prints the two ``carry`` lists with their sizes. ``docs/models.md`` has the commands.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import subprocess
import sys
from pathlib import Path

from hypic_agent.config import Settings
from hypic_agent.runtime.models.loading.catalog import CATALOG, catalog_path, resolve_model
from hypic_agent.runtime.models.loading.tokenizer import load_tokenizer
from hypic_agent.training.data import CorpusSpec, build_corpus, default_shared_data
from hypic_agent.training.transfer import split_file

WHEELS = ("pydantic", "pydantic-core", "pydantic-settings", "python-dotenv", "annotated-types", "typing-inspection")
WHEELS_EXTRA = ("gguf",)
LIMIT = 64 << 20


def download_wheels(dest: Path) -> None:
    """``pip download`` the pinned cp312 manylinux wheels (no install)."""
    dest.mkdir(parents=True, exist_ok=True)
    specs = [f"{n}=={md.version(n)}" for n in (*WHEELS, *WHEELS_EXTRA)]
    plats = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        "3.12",
    ]
    cmd += ["--implementation", "cp", *[a for p in plats for a in ("--platform", p)], "-d", str(dest), *specs]
    subprocess.run(cmd, check=True)


def _size(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else p.stat().st_size


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m hypic_agent.training.prepare")
    ap.add_argument("--out", type=Path, default=Path(".cache/distill"))
    ap.add_argument("--teacher", default="smollm2-135m-instruct")
    ap.add_argument("--shared-data", type=Path, default=default_shared_data())
    ap.add_argument("--max-tokens", type=int, default=10_500_000)
    ap.add_argument("--part-mb", type=float, default=60.0)
    ap.add_argument("--tree-mb", type=float, default=2.0, help="what the working tree itself takes per call")
    a = ap.parse_args(argv)
    settings = Settings()
    src = resolve_model(a.teacher, settings)
    assert src.path is not None
    corpus = a.out / "corpus"
    if not (corpus / "meta.json").is_file():
        spec = CorpusSpec(shared_data=a.shared_data, max_tokens=a.max_tokens)
        meta = build_corpus(spec, load_tokenizer(src), corpus, log=lambda s: None)
        print(f"corpus: {meta.train_tokens:,} train / {meta.eval_tokens:,} held-out tokens {meta.docs}")
    parts = split_file(src.path, a.out / "base", int(a.part_mb * 1_000_000))
    if not (a.out / "whl").is_dir():
        download_wheels(a.out / "whl")
    tree = int(a.tree_mb * (1 << 20))
    calls = {"A": [parts[0]], "B": [*parts[1:], corpus]}
    for name, paths in calls.items():
        carry = [*paths, a.out / "whl"]
        total = tree + sum(_size(p) for p in carry)
        ok = "ok" if total <= LIMIT else "OVER THE 64 MiB LIMIT"
        print(f"call {name}: carry {[str(p) for p in carry]} = {total / (1 << 20):.1f} MiB with the tree ({ok})")
    if a.teacher in CATALOG:
        e = CATALOG[a.teacher]
        print(f"device target: ~/{catalog_path(e, settings).relative_to(Path.home())}  sha256 {e.sha256}")


if __name__ == "__main__":
    main()
