"""RAG on HotpotQA: each Wikipedia paragraph is a document segment; answers scored with SQuAD F1/EM.

Every question is asked twice: once with its paragraphs in dataset order (cold: each paragraph is
prefilled and cached on its own), then with the paragraphs reversed (warm: every paragraph is a
cache hit at its new position). The table compares quality and TTFT of the two passes.

Data: ``<repo>/../shared/data/hotpotqa_dev.jsonl`` (or ``--data``); skipped cleanly when absent.

    hypic-agent serve
    python examples/rag_hotpotqa.py --limit 10
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import mean

from _common import ExampleFailure, banner, budget, client, gen_kwargs, parser, require_answer, run, table
from _data import HOTPOTQA, QAItem, load_hotpotqa, resolve
from _metrics import contains_answer, exact_match, f1
from hypic_client import Hypic, Usage, doc, system

SYSTEM = system("Answer the question from the documents with a short phrase.")
NO_REUSE_MODES = ("full_recompute", "prefix_cache")


@dataclass
class Pass:
    """One answer to one question: its scores, TTFT and the server's usage."""

    answer: str
    f1: float
    em: float
    acc: float
    ttft_ms: float
    usage: Usage


def ask(hypic: Hypic, item: QAItem, order: list[int], kw: dict, what: str, smoke: bool) -> Pass:
    segments = [SYSTEM, *(doc(item.paragraphs[i].text, title=item.paragraphs[i].title) for i in order)]
    resp = hypic.generate(segments, f"{item.question}\nAnswer with a few words only.", **kw)
    answer = first_line(require_answer(resp.text, what, smoke=smoke))
    g = item.answers
    return Pass(
        answer,
        f1(answer, g),
        exact_match(answer, g),
        contains_answer(answer, g),
        resp.timings.ttft_ms or 0.0,
        resp.usage,
    )


def first_line(text: str) -> str:
    """The first line of the answer (small models tend to ramble on); the raw text if that is blank."""
    return text.strip().split("\n")[0].strip() or text


def summary(passes: list[Pass]) -> str:
    cached = sum(p.usage.cached_tokens for p in passes) / max(sum(p.usage.prompt_tokens for p in passes), 1)
    return (
        f"F1 {mean(p.f1 for p in passes):.3f}  EM {mean(p.em for p in passes):.3f}  "
        f"acc {mean(p.acc for p in passes):.3f}  mean ttft {mean(p.ttft_ms for p in passes):.0f} ms  "
        f"cached {cached:.0%} of prompt tokens"
    )


def main() -> None:
    p = parser(__doc__.splitlines()[0], limit=10, max_tokens=24)
    p.add_argument("--data", default=None, help=f"{HOTPOTQA} or the folder holding it")
    p.add_argument("--max-paragraphs", type=int, default=0, help="keep supporting + distractors up to N (0 = all)")
    p.add_argument("--max-chars", type=int, default=0, help="clip each paragraph (0 = no clip)")
    p.add_argument("--no-reorder", action="store_true", help="skip the second, reordered pass")
    args = p.parse_args()
    b = budget(args)
    max_paragraphs, max_chars = (2, 200) if args.smoke else (args.max_paragraphs, args.max_chars)
    items = load_hotpotqa(resolve(args.data, HOTPOTQA, "HotpotQA"), b.limit, max_paragraphs, max_chars)
    kw = gen_kwargs(args, b.max_tokens)
    rows, cold, warm = [], [], []
    with client(args) as hypic:
        banner("rag_hotpotqa", f"{len(items)} questions against {args.url} ({hypic.health().model_dump()['model']})")
        for n, item in enumerate(items, 1):
            order = list(range(len(item.paragraphs)))
            cold.append(c := ask(hypic, item, order, kw, f"question {n} ({item.id})", args.smoke))
            row = [n, item.question, item.answers[0], c.answer, c.f1, c.em, f"{c.ttft_ms:.0f}"]
            if not args.no_reorder:
                warm.append(w := ask(hypic, item, order[::-1], kw, f"question {n} reordered", args.smoke))
                if args.mode not in NO_REUSE_MODES and w.usage.cached_tokens == 0:
                    raise ExampleFailure(f"question {n}: reordered paragraphs were not served from the cache")
                row += [w.f1, f"{w.ttft_ms:.0f}", f"{w.usage.cached_tokens}/{w.usage.prompt_tokens}"]
            rows.append(row)
    headers = ["#", "question", "gold", "answer", "F1", "EM", "ttft_ms"]
    widths = [3, 44, 20, 36, 5, 4, 8]
    if warm:
        headers += ["F1_reord", "ttft_reord", "cached/prompt"]
        widths += [8, 10, 13]
    print(table(headers, rows, widths))
    print(f"dataset order:  {summary(cold)}")
    if warm:
        print(f"reversed order: {summary(warm)}")
    print(f"OK rag_hotpotqa: {len(rows)} questions, F1 {mean(p.f1 for p in cold):.3f}")


if __name__ == "__main__":
    run(main)
