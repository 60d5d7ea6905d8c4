"""Distillation corpus: sources (never questions / answers), split, deterministic blocks."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import torch

from hypic_agent.runtime.models.loading.tokenizer import tiny_tokenizer
from hypic_agent.training.data import CorpusSpec, TokenData, build_corpus, collect_docs, iter_doc_files, iter_passages


def _fake_shared_data(folder: Path) -> None:
    hotpot = {"question_text": "QUESTION-HOTPOT?", "answers_objects": [{"spans": ["ANSWER-HOTPOT"]}],
              "contexts": [{"title": "Alpha", "paragraph_text": "Alpha is a letter. " * 5}]}  # fmt: skip
    (folder / "hotpotqa_dev.jsonl").write_text(json.dumps(hotpot) + "\n")
    nq = {"question": "QUESTION-NQ?", "answers": ["ANSWER-NQ"], "ctxs": [{"title": "Beta", "text": "Beta text. " * 5}]}
    with gzip.open(folder / "nq_open_oracle.jsonl.gz", "wt") as f:
        f.write(json.dumps(nq) + "\n")
    mn = {
        "_id": "m1",
        "context": "Passage 1:\nFirst NEWLINE_CHAR article.\nPassage 2:\nSecond article.",
        "answers": ["SUMMARY-MN"],
    }
    (folder / "multinews_longbench.jsonl").write_text(json.dumps(mn) + "\n")


def test_passages_only_contexts(tmp_path: Path) -> None:
    _fake_shared_data(tmp_path)
    docs = list(iter_passages(tmp_path))
    text = "\n".join(t for _, t in docs)
    assert "Alpha is a letter." in text and "Beta text." in text and "Second article." in text
    assert "First\narticle." in text
    for secret in ("QUESTION", "ANSWER", "SUMMARY"):
        assert secret not in text
    assert len(docs) == 4


def test_doc_files_filtering(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "README.md").write_text("Readme words. " * 30)
    (pkg / "copyright").write_text("License. " * 50)
    with gzip.open(pkg / "NEWS.gz", "wt") as f:
        f.write("News item. " * 30)
    (pkg / "page.html").write_text(
        "<html><script>var x;</script><p>Hello &amp; welcome. " + "Text. " * 40 + "</p></html>"
    )
    (pkg / "blob.txt").write_bytes(bytes(range(256)) * 20)
    docs = dict(iter_doc_files((tmp_path,), 10_000))
    names = sorted(Path(k.removeprefix("doc:")).name for k in docs)
    assert names == ["NEWS.gz", "README.md", "page.html"]
    html_text = docs[f"doc:{pkg / 'page.html'}"]
    assert "Hello & welcome." in html_text and "<p>" not in html_text and "var x" not in html_text


def test_build_split_and_blocks(tmp_path: Path) -> None:
    docs = [("python", (f"doc{i}", f"Document number {i}. " * 20)) for i in range(200)]
    tok = tiny_tokenizer()
    meta = build_corpus(CorpusSpec(eval_fraction=0.1), tok, tmp_path, docs=docs, log=lambda s: None)
    assert meta.eval_tokens > 0 and meta.train_tokens > 5 * meta.eval_tokens
    assert meta.separator == tok.convert_tokens_to_ids("<|endoftext|>")
    data = TokenData(tmp_path)
    assert data.train.dtype == np.uint16 and len(data.train) == meta.train_tokens
    a, b = data.batch(3, 4, 32, seed=1), data.batch(3, 4, 32, seed=1)
    assert a.shape == (4, 32) and a.dtype == torch.int64 and torch.equal(a, b)
    assert not torch.equal(a, data.batch(4, 4, 32, seed=1))
    ev = data.eval_blocks(32, 10_000)
    assert ev.shape[1] == 32 and torch.equal(
        ev.flatten(), torch.from_numpy(np.asarray(data.eval[: ev.numel()], dtype=np.int64))
    )
    # the split is a function of the document id: the same documents land in eval in a smaller corpus
    build_corpus(CorpusSpec(eval_fraction=0.1), tok, tmp_path / "half", docs=docs[:100], log=lambda s: None)
    half = TokenData(tmp_path / "half")
    assert np.array_equal(half.eval, data.eval[: len(half.eval)])


def test_collect_docs_dedups_and_caps(tmp_path: Path) -> None:
    _fake_shared_data(tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("Same text. " * 30)
    (tmp_path / "docs" / "b.txt").write_text("Same text. " * 30)
    spec = CorpusSpec(sources=("passages", "docs"), shared_data=tmp_path, doc_dirs=(tmp_path / "docs",))
    got = list(collect_docs(spec))
    assert [s for s, _ in got].count("docs") == 1 and got[0][0] == "passages"
