"""A small built-in corpus (no download) and a lexical scorer for the framework RAG examples.

``CORPUS``: short encyclopedia-style paragraphs ``(title, text)``; ``QUESTIONS``: questions whose
gold answer is in one paragraph and whose keywords pull in one or two related ones, so consecutive
questions share retrieved paragraphs (the cache reuse the server is for).
``keyword_scores`` ranks paragraphs by IDF-weighted word overlap with the query, standing in for
an embedding retriever without needing a model.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

CORPUS: list[tuple[str, str]] = [
    (
        "Marie Curie",
        "Marie Curie was a Polish and naturalised French physicist and chemist who conducted pioneering research "
        "on radioactivity. She was the first woman to win a Nobel Prize and the only person to win Nobel Prizes in "
        "two scientific fields: physics in 1903 and chemistry in 1911. She was born in Warsaw in 1867.",
    ),
    (
        "Pierre Curie",
        "Pierre Curie was a French physicist who shared the 1903 Nobel Prize in Physics with his wife Marie Curie "
        "and Henri Becquerel. Before his work on radioactivity he studied magnetism and discovered the Curie "
        "temperature, above which certain materials lose their magnetic properties.",
    ),
    (
        "Polonium",
        "Polonium is a rare and highly radioactive chemical element with the symbol Po and atomic number 84. It was "
        "discovered in 1898 by Marie and Pierre Curie, who named it after Poland, Marie Curie's native country.",
    ),
    (
        "Danube",
        "The Danube is the second-longest river in Europe after the Volga. It rises in the Black Forest in Germany "
        "and flows about 2,850 kilometres through ten countries, including Austria, Hungary and Romania, before "
        "emptying into the Black Sea.",
    ),
    (
        "Budapest",
        "Budapest is the capital and most populous city of Hungary. The city was formed in 1873 by the union of "
        "Buda and Obuda on the west bank of the Danube with Pest on the east bank. Its parliament building stands "
        "on the river.",
    ),
    (
        "Vienna",
        "Vienna is the capital of Austria and lies on the Danube. It was the seat of the Habsburg monarchy for "
        "centuries and is known for its classical music tradition: Mozart, Beethoven and Schubert all worked in "
        "the city.",
    ),
    (
        "Ada Lovelace",
        "Ada Lovelace was an English mathematician who worked with Charles Babbage on his proposed mechanical "
        "general-purpose computer, the Analytical Engine. Her notes from 1843 include an algorithm for computing "
        "Bernoulli numbers, often called the first computer program.",
    ),
    (
        "Analytical Engine",
        "The Analytical Engine was a mechanical general-purpose computer designed by the English mathematician "
        "Charles Babbage, first described in 1837. It was never completed, but its design had an arithmetic unit, "
        "control flow with loops and branches, and memory, like a modern computer.",
    ),
]

QUESTIONS: list[tuple[str, list[str]]] = [
    ("In which city was Marie Curie born?", ["Warsaw"]),
    ("Which element did Marie and Pierre Curie name after Poland?", ["Polonium"]),
    ("Into which sea does the Danube river flow?", ["the Black Sea", "Black Sea"]),
    ("Which capital city on the Danube was formed in 1873?", ["Budapest"]),
    ("Who designed the Analytical Engine?", ["Charles Babbage", "Babbage"]),
    ("For which machine did Ada Lovelace write the first computer program?", ["the Analytical Engine"]),
]

_WORD = re.compile(r"[a-z0-9]+")
_STOP = frozenset(
    [
        "a",
        "an",
        "the",
        "of",
        "in",
        "on",
        "to",
        "and",
        "or",
        "for",
        "which",
        "who",
        "what",
        "did",
        "does",
        "is",
        "was",
        "were",
        "by",
        "with",
        "from",
        "into",
        "its",
        "it",
    ]
)


def terms(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.lower()) if w not in _STOP]


def keyword_scores(query: str, texts: Sequence[str]) -> list[float]:
    """IDF-weighted count of query terms in each text (0 when none occur), one score per text."""
    docs = [Counter(terms(t)) for t in texts]
    n = len(docs)
    scores = []
    for d in docs:
        s = 0.0
        for q in set(terms(query)):
            if q in d:
                df = sum(1 for other in docs if q in other)
                s += math.log(1 + n / df)
        scores.append(s)
    return scores


def top_k(query: str, texts: Sequence[str], k: int) -> list[tuple[int, float]]:
    """Indices and scores of the ``k`` best texts with a positive score, best first."""
    ranked = sorted(enumerate(keyword_scores(query, texts)), key=lambda x: -x[1])
    return [(i, s) for i, s in ranked[:k] if s > 0]
