"""Datasets and metrics for the quality benchmark.

Every example becomes ``(system, documents, question, gold answers)``: each document is one
segment (a paragraph, a passage, or a group of key-value records), shuffled with a per-example
seed so reuse is position-independent. Data come from ``../shared/data`` (never copied here).
"""

from __future__ import annotations

import gzip
import json
import random
import re
import string
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
SYSTEM = "Answer the question using the documents. Reply with a short answer only."


@dataclass
class Example:
    qid: str
    docs: list[tuple[str | None, str]]  # (title, text) per segment, already shuffled
    question: str
    answers: list[str]
    metric: str  # "f1" | "em" | "rougeL"
    system: str = SYSTEM


def _jsonl(path: Path) -> Iterator[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def hotpotqa(data: Path, limit: int, seed: int) -> list[Example]:
    out = []
    for i, r in enumerate(_jsonl(data / "hotpotqa_dev.jsonl")):
        if i >= limit:
            break
        docs = [(c["title"], c["paragraph_text"]) for c in r["contexts"]]
        random.Random(seed + i).shuffle(docs)
        out.append(Example(r["question_id"], docs, r["question_text"], r["answers_objects"][0]["spans"], "f1"))
    return out


def nq(data: Path, limit: int, seed: int, distractors: int = 9) -> list[Example]:
    rows = list(_jsonl(data / "nq_open_oracle.jsonl.gz"))
    out = []
    for i, r in enumerate(rows[:limit]):
        rng = random.Random(seed + i)
        gold = r["ctxs"][0]
        others = [rows[j]["ctxs"][0] for j in rng.sample(range(len(rows)), distractors + 1) if j != i][:distractors]
        docs = [(c["title"], c["text"]) for c in [gold, *others]]
        rng.shuffle(docs)
        out.append(Example(f"nq{i}", docs, r["question"], list(r["answers"]), "f1"))
    return out


def kv_retrieval(data: Path, limit: int, seed: int, group: int = 15) -> list[Example]:
    out = []
    for i, r in enumerate(_jsonl(data / "kv_retrieval_75.jsonl.gz")):
        if i >= limit:
            break
        recs = r["ordered_kv_records"]
        docs = [(None, "\n".join(f'"{k}": "{v}"' for k, v in recs[j : j + group])) for j in range(0, len(recs), group)]
        random.Random(seed + i).shuffle(docs)
        q = f'What is the value of key "{r["key"]}"? Reply with the value only.'
        out.append(Example(f"kv{i}", docs, q, [r["value"]], "em", system="The documents are JSON key-value records."))
    return out


def multinews(data: Path, limit: int, seed: int) -> list[Example]:
    out = []
    for i, r in enumerate(_jsonl(data / "multinews_longbench.jsonl")):
        if i >= limit:
            break
        parts = [p.strip().replace("NEWLINE_CHAR", "\n") for p in re.split(r"Passage \d+:", r["context"]) if p.strip()]
        docs: list[tuple[str | None, str]] = [(None, p) for p in parts]
        random.Random(seed + i).shuffle(docs)
        out.append(
            Example(
                r["_id"],
                docs,
                "Write a short summary of the news in the documents.",
                list(r["answers"]),
                "rougeL",
                system="You summarize news articles.",
            )
        )
    return out


DATASETS = {"hotpotqa": hotpotqa, "nq": nq, "kv": kv_retrieval, "multinews": multinews}


# ------------------------------------------------------------------ metrics
def normalize(s: str) -> str:
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def f1(pred: str, gold: str) -> float:
    p, g = normalize(pred).split(), normalize(gold).split()
    common = Counter(p) & Counter(g)
    same = sum(common.values())
    if not p or not g or same == 0:
        return float(p == g)
    prec, rec = same / len(p), same / len(g)
    return 2 * prec * rec / (prec + rec)


def exact(pred: str, gold: str) -> float:
    return float(normalize(gold) in normalize(pred)) if gold else 0.0


def rouge_l(pred: str, gold: str) -> float:
    a, b = normalize(pred).split(), normalize(gold).split()
    if not a or not b:
        return 0.0
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    lcs = prev[-1]
    if lcs == 0:
        return 0.0
    p, r = lcs / len(a), lcs / len(b)
    return 2 * p * r / (p + r)


METRICS = {"f1": f1, "em": exact, "rougeL": rouge_l}


def score(ex: Example, pred: str) -> float:
    fn = METRICS[ex.metric]
    return max(fn(pred, g) for g in ex.answers) * 100
