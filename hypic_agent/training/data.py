"""Offline distillation text: collect, tokenize with the teacher tokenizer, split, sample blocks.

Sources (all local, nothing downloaded):

* ``passages``: the context passages of ``../shared/data`` (HotpotQA paragraphs, NQ passages,
  Multi-News articles). Questions, answers and reference summaries are never read; the
  synthetic KV-retrieval records are left out too.
* ``docs``: Debian documentation text under ``/usr/share/doc`` and ``/usr/share/info`` (README,
  NEWS, upstream changelogs, txt/md/rst/html, gzipped or not; copyright files, PDFs,
  PostScript and Debian changelogs skipped), capped per file.
* ``python``: the Python standard library sources of the running interpreter (docstrings and code).

Each document is assigned to the held-out split by a hash of its id (``eval_fraction``), so the
split is stable however many documents are read. Documents are joined with the tokenizer's
``<|endoftext|>`` (or EOS) token into one stream per split, stored as ``train.bin`` /
``eval.bin`` (uint16 when the vocabulary fits, else int32) plus ``meta.json``.
"""

from __future__ import annotations

import gzip
import hashlib
import html
import json
import os
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hypic_agent.errors import InvalidRequestError

Doc = tuple[str, str]  # (stable id, text)
_TEXT_SUFFIXES = {".txt", ".md", ".rst", ".html", ".htm", ".text", ""}
_SKIP_NAMES = re.compile(r"^(copyright|changelog\.Debian.*|all\.html?)$|\.(pdf|ps|json|log|tar|css|js|png|gif)(\.gz)?$")
_TAG = re.compile(r"<(script|style)[^>]*>.*?</\1>|<[^>]+>", re.S)
SOURCES = ("passages", "docs", "python")


@dataclass(frozen=True)
class CorpusSpec:
    """What to collect and how to split it."""

    sources: tuple[str, ...] = SOURCES
    shared_data: Path | None = None  # folder with the benchmark datasets (passages source)
    doc_dirs: tuple[Path, ...] = (Path("/usr/share/doc"), Path("/usr/share/info"))
    max_tokens: int = 10_000_000
    eval_fraction: float = 0.03
    max_doc_chars: int = 200_000
    seed: int = 0


@dataclass
class CorpusMeta:
    """``meta.json`` of a built corpus."""

    train_tokens: int
    eval_tokens: int
    docs: dict[str, int]
    dtype: str
    separator: int
    vocab_size: int
    spec: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------- sources
def default_shared_data() -> Path | None:
    """``../shared/data`` beside the project root, when present (the benchmark datasets)."""
    p = Path(__file__).resolve().parents[2].parent / "shared" / "data"
    return p if p.is_dir() else None


def _open_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:  # type: ignore[operator]
        for line in f:
            if line.strip():
                yield json.loads(line)


def iter_passages(data_dir: Path) -> Iterator[Doc]:
    """Context passages only (never questions / answers / summaries)."""
    hp = data_dir / "hotpotqa_dev.jsonl"
    if hp.is_file():
        for row in _open_jsonl(hp):
            for c in row.get("contexts", []):
                yield f"hotpot:{c.get('title')}", f"{c.get('title', '')}\n{c.get('paragraph_text', '')}"
    nq = data_dir / "nq_open_oracle.jsonl.gz"
    if nq.is_file():
        for row in _open_jsonl(nq):
            for c in row.get("ctxs", []):
                yield f"nq:{c.get('title')}:{c.get('text', '')[:64]}", f"{c.get('title', '')}\n{c.get('text', '')}"
    mn = data_dir / "multinews_longbench.jsonl"
    if mn.is_file():
        for row in _open_jsonl(mn):
            parts = re.split(r"Passage \d+:\n", row.get("context", ""))
            for j, p in enumerate(x for x in parts if x.strip()):
                yield f"multinews:{row.get('_id')}:{j}", p.replace(" NEWLINE_CHAR ", "\n").replace("NEWLINE_CHAR", "\n")


def _read_text(path: Path, limit: int) -> str | None:
    try:
        if path.suffix == ".gz":
            with gzip.open(path) as f:
                raw = f.read(limit * 2)
        else:
            with path.open("rb") as f:
                raw = f.read(limit * 2)
    except (OSError, EOFError, gzip.BadGzipFile):
        return None
    text = raw.decode("utf-8", errors="ignore")
    if not text or sum(not (c.isprintable() or c in "\n\t") for c in text[:4000]) > 0.02 * min(len(text), 4000):
        return None
    if path.name.removesuffix(".gz").endswith((".html", ".htm")):
        text = html.unescape(_TAG.sub(" ", text))
        text = re.sub(r"[ \t]+", " ", re.sub(r"\n\s*\n+", "\n\n", text))
    return text[:limit]


def iter_doc_files(dirs: tuple[Path, ...], limit: int) -> Iterator[Doc]:
    """Plain-text documentation files under ``dirs`` (sorted walk, deterministic)."""
    for root in dirs:
        if not root.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                path = Path(dirpath) / name
                if _SKIP_NAMES.search(name) or path.is_symlink():
                    continue
                if Path(name.removesuffix(".gz")).suffix.lower() not in _TEXT_SUFFIXES and root.name != "info":
                    continue
                text = _read_text(path, limit)
                if text and len(text) > 200:
                    yield f"doc:{path}", text


def iter_python_sources(limit: int) -> Iterator[Doc]:
    """The standard library's ``*.py`` files (tests and site-packages excluded)."""
    root = Path(os.__file__).parent
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(("site-packages/", "test/", "idlelib/", "lib2to3/tests")) or "/tests/" in rel:
            continue
        text = _read_text(path, limit)
        if text and len(text) > 200:
            yield f"py:{rel}", text


def builtin_texts(n_files: int = 12, limit: int = 20_000, piece: int = 2000) -> list[Doc]:
    """A few stdlib sources (always present) cut into ``piece``-character documents: the ``--tiny`` corpus."""
    out: list[Doc] = []
    for i, (doc_id, text) in enumerate(iter_python_sources(limit)):
        if i >= n_files:
            break
        out += [(f"{doc_id}#{j}", text[j : j + piece]) for j in range(0, len(text), piece)]
    return out


# ---------------------------------------------------------------------------- building
def _is_eval(doc_id: str, fraction: float) -> bool:
    h = int.from_bytes(hashlib.blake2b(doc_id.encode(), digest_size=8).digest(), "little")
    return (h % 100_000) < fraction * 100_000


def collect_docs(spec: CorpusSpec) -> Iterator[tuple[str, Doc]]:
    """``(source, doc)`` in a deterministic order: passages first, then docs and python interleaved
    in a seeded shuffle; exact duplicates dropped."""
    seen: set[bytes] = set()

    def fresh(doc: Doc) -> bool:
        h = hashlib.blake2b(doc[1].encode(), digest_size=16).digest()
        if h in seen:
            return False
        seen.add(h)
        return True

    if "passages" in spec.sources and spec.shared_data is not None:
        for d in iter_passages(spec.shared_data):
            if fresh(d):
                yield "passages", d
    rest: list[tuple[str, Doc]] = []
    if "docs" in spec.sources:
        rest += [("docs", d) for d in iter_doc_files(spec.doc_dirs, spec.max_doc_chars)]
    if "python" in spec.sources:
        rest += [("python", d) for d in iter_python_sources(spec.max_doc_chars)]
    random.Random(spec.seed).shuffle(rest)
    for src, d in rest:
        if fresh(d):
            yield src, d


def separator_id(tokenizer: Any) -> int:
    """Id of ``<|endoftext|>`` (the document separator SmolLM2 was trained with), else EOS."""
    tid = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    if isinstance(tid, int) and tid >= 0 and tokenizer.convert_ids_to_tokens(tid) == "<|endoftext|>":
        return tid
    return int(tokenizer.eos_token_id)


def build_corpus(
    spec: CorpusSpec,
    tokenizer: Any,
    out_dir: Path,
    *,
    docs: list[tuple[str, Doc]] | None = None,
    log: Callable[[str], None] = print,
    batch: int = 256,
) -> CorpusMeta:
    """Tokenize the collected documents into ``out_dir/{train,eval}.bin`` + ``meta.json``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    sep = separator_id(tokenizer)
    vocab = len(tokenizer)
    dtype = np.uint16 if vocab <= np.iinfo(np.uint16).max else np.int32
    streams: dict[str, list[np.ndarray]] = {"train": [], "eval": []}
    counts = {"train": 0, "eval": 0}
    per_source: dict[str, int] = {}
    pending: list[tuple[str, Doc]] = []

    def flush() -> None:
        enc = tokenizer([d[1] for _, d in pending], add_special_tokens=False)["input_ids"]
        for (src, (doc_id, _)), ids in zip(pending, enc, strict=True):
            if counts["train"] + counts["eval"] >= spec.max_tokens:
                break
            split = "eval" if _is_eval(doc_id, spec.eval_fraction) else "train"
            streams[split].append(np.asarray([*ids, sep], dtype=dtype))
            counts[split] += len(ids) + 1
            per_source[src] = per_source.get(src, 0) + len(ids) + 1
        pending.clear()

    for item in docs if docs is not None else collect_docs(spec):
        pending.append(item)
        if len(pending) >= batch:
            flush()
            log(f"corpus: {counts['train']:,} train / {counts['eval']:,} eval tokens")
        if counts["train"] + counts["eval"] >= spec.max_tokens:
            break
    if pending:
        flush()
    if not counts["train"] or not counts["eval"]:
        raise InvalidRequestError(
            f"corpus too small ({counts}); add sources (--data-sources) or raise eval_fraction", param="data"
        )
    for split, parts in streams.items():
        np.concatenate(parts).tofile(out_dir / f"{split}.bin")
    spec_d = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(spec).items()}
    spec_d["doc_dirs"] = [str(p) for p in spec.doc_dirs]
    meta = CorpusMeta(counts["train"], counts["eval"], per_source, np.dtype(dtype).name, sep, vocab, spec_d)
    (out_dir / "meta.json").write_text(json.dumps(asdict(meta), indent=1))
    return meta


# ---------------------------------------------------------------------------- reading
class TokenData:
    """A built corpus, memory-mapped. Blocks for a step are a pure function of (seed, step)."""

    def __init__(self, folder: Path) -> None:
        meta_path = folder / "meta.json"
        if not meta_path.is_file():
            raise InvalidRequestError(f"{folder} is not a token corpus (no meta.json); build it first", param="data")
        self.folder = folder
        self.meta = CorpusMeta(**json.loads(meta_path.read_text()))
        dt = np.dtype(self.meta.dtype)
        self.train = np.memmap(folder / "train.bin", dtype=dt, mode="r")
        self.eval = np.memmap(folder / "eval.bin", dtype=dt, mode="r")

    def batch(self, step: int, batch: int, seq: int, seed: int = 0) -> torch.Tensor:
        """``[batch, seq]`` int64 blocks at random offsets of the train stream."""
        n = self.train.shape[0] - seq
        if n <= 0:
            raise InvalidRequestError(f"train split has {self.train.shape[0]} tokens, fewer than --seq {seq}")
        rng = np.random.default_rng([seed, step])
        starts = rng.integers(0, n, size=batch)
        return torch.from_numpy(np.stack([self.train[s : s + seq].astype(np.int64) for s in starts]))

    def eval_blocks(self, seq: int, max_tokens: int) -> torch.Tensor:
        """Consecutive non-overlapping ``[N, seq]`` blocks from the start of the held-out stream."""
        n = min(self.eval.shape[0], max_tokens) // seq
        if n == 0:
            raise InvalidRequestError(f"held-out split has {self.eval.shape[0]} tokens, fewer than --seq {seq}")
        return torch.from_numpy(np.asarray(self.eval[: n * seq], dtype=np.int64).reshape(n, seq))
