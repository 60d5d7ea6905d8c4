"""Evaluation data read from ``<repo>/../shared/data`` (or ``--data``); never downloaded.

* HotpotQA (``hotpotqa_dev.jsonl``): one question, its 2-10 Wikipedia paragraphs, gold spans.
* Multi-News (``multinews_longbench.jsonl``): ``context`` = "Passage 1: ... Passage k: ...",
  ``answers`` = the reference summary.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from _common import REPO, skip

DATA_DIR = REPO.parent / "shared" / "data"
HOTPOTQA = "hotpotqa_dev.jsonl"
MULTINEWS = "multinews_longbench.jsonl"


@dataclass
class Paragraph:
    title: str
    text: str
    supporting: bool = False


@dataclass
class QAItem:
    id: str
    question: str
    answers: list[str]
    paragraphs: list[Paragraph] = field(default_factory=list)


@dataclass
class SummaryItem:
    id: str
    passages: list[str]
    reference: str


def resolve(data: str | None, filename: str, what: str) -> Path:
    """``--data`` (a file, or a folder holding ``filename``), else the shared data folder; SKIP if absent."""
    path = Path(data) if data else DATA_DIR
    if path.is_dir() or not path.suffix:
        path = path / filename
    if not path.is_file():
        skip(f"{what} data not found at {path} (expected {DATA_DIR / filename}); pass --data PATH to run this example")
    return path


def _rows(path: Path) -> Iterator[dict]:
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def clip(text: str, max_chars: int) -> str:
    """``text`` cut at a word boundary to at most ``max_chars`` (0 = unlimited)."""
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    cut = text[:max_chars]
    return cut[: cut.rfind(" ")] if " " in cut else cut


def load_hotpotqa(path: Path, limit: int, max_paragraphs: int = 0, max_chars: int = 0) -> list[QAItem]:
    """The first ``limit`` questions. ``max_paragraphs`` > 0 keeps the supporting paragraphs and
    fills up with distractors (dataset order kept); ``max_chars`` clips each paragraph."""
    out = []
    for row in _rows(path):
        if len(out) >= limit:
            break
        paras = [
            Paragraph(c["title"], clip(" ".join(c["paragraph_text"].split()), max_chars), bool(c.get("is_supporting")))
            for c in row["contexts"]
        ]
        if max_paragraphs > 0 and len(paras) > max_paragraphs:
            keep = {i for i, p in enumerate(paras) if p.supporting}
            keep |= set([i for i in range(len(paras)) if i not in keep][: max(max_paragraphs - len(keep), 0)])
            paras = [p for i, p in enumerate(paras) if i in keep]
        answers = [s for a in row["answers_objects"] for s in a.get("spans", []) if s]
        out.append(QAItem(row["question_id"], row["question_text"], answers, paras))
    return out


_PASSAGE = re.compile(r"(?:^|\n)Passage \d+:\n")


def split_passages(context: str) -> list[str]:
    """``"Passage 1:\\n... Passage 2:\\n..."`` -> the passages, ``NEWLINE_CHAR`` turned into newlines."""
    text = context.replace("NEWLINE_CHAR", "\n")
    parts = [" ".join(p.split()) for p in _PASSAGE.split(text)]
    return [p for p in parts if p]


def load_multinews(path: Path, limit: int, max_passages: int = 0, max_chars: int = 0) -> list[SummaryItem]:
    out = []
    for row in _rows(path):
        if len(out) >= limit:
            break
        passages = [clip(p, max_chars) for p in split_passages(row["context"])]
        if max_passages > 0:
            passages = passages[:max_passages]
        answers = row["answers"] if isinstance(row["answers"], list) else [row["answers"]]
        reference = " ".join(str(answers[0]).replace("NEWLINE_CHAR", " ").lstrip("– ").split())
        out.append(SummaryItem(str(row.get("_id", len(out))), passages, reference))
    return out
