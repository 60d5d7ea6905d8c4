"""Answer and summary scores, small and dependency free.

* ``exact_match`` / ``f1``: SQuAD v1.1 style (lower case, no punctuation, no articles a/an/the,
  whitespace collapsed), maxed over the gold answers; ``contains_answer``: a normalized gold answer
  occurs inside the normalized prediction (the lenient "accuracy" used for chatty small models).
* ``rouge_l``: ROUGE-L F-measure (beta = 1) from the longest common subsequence of lower-cased
  word tokens (``[a-z0-9]+``), maxed over the references. No stemming or stopword removal, so it
  reads a little lower than ``rouge-score`` with ``use_stemmer=True``.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)
_WORD = re.compile(r"[a-z0-9]+")


def normalize_answer(s: str) -> str:
    s = "".join(ch for ch in s.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def _f1_one(prediction: str, gold: str) -> float:
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    common = Counter(pred) & Counter(ref)
    same = sum(common.values())
    if not pred or not ref:
        return float(pred == ref)
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def f1(prediction: str, golds: Sequence[str]) -> float:
    """Token F1 against the best matching gold answer, in [0, 1]."""
    return max((_f1_one(prediction, g) for g in golds), default=0.0)


def exact_match(prediction: str, golds: Sequence[str]) -> float:
    """1.0 when the normalized prediction equals a normalized gold answer."""
    p = normalize_answer(prediction)
    return float(any(p == normalize_answer(g) for g in golds))


def words(s: str) -> list[str]:
    return _WORD.findall(s.lower())


def lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest common subsequence, O(len(a) * len(b)) time, O(len(b)) memory."""
    if not a or not b:
        return 0
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b, 1):
            cur.append(prev[j - 1] + 1 if x == y else max(prev[j], cur[j - 1]))
        prev = cur
    return prev[-1]


def rouge_l(prediction: str, references: Sequence[str]) -> float:
    """ROUGE-L F1 against the best reference, in [0, 1]."""
    pred = words(prediction)
    best = 0.0
    for ref in references:
        r = words(ref)
        lcs = lcs_length(pred, r)
        if lcs:
            p, rec = lcs / len(pred), lcs / len(r)
            best = max(best, 2 * p * rec / (p + rec))
    return best


def contains_answer(prediction: str, golds: Sequence[str]) -> float:
    """1.0 when a normalized gold answer occurs in the normalized prediction (lenient for chatty models)."""
    p = f" {normalize_answer(prediction)} "
    return float(any(g and f" {g} " in p for g in (normalize_answer(x) for x in golds)))
