"""Multi-document summarization on Multi-News: each news passage is a document segment; ROUGE-L.

Every cluster of articles is summarized twice: passages in dataset order (cold), then in reverse
order (warm: each passage is a cache hit at its new position). ROUGE-L (own implementation, see
``_metrics.py``) compares each summary with the reference; the table shows both passes' scores,
TTFT and cached tokens.

Data: ``<repo>/../shared/data/multinews_longbench.jsonl`` (or ``--data``); skipped cleanly when absent.

    hypic-agent serve
    python examples/summarize_multinews.py --limit 5
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import mean

from _common import ExampleFailure, banner, budget, client, gen_kwargs, parser, require_answer, run, table
from _data import MULTINEWS, SummaryItem, load_multinews, resolve
from _metrics import rouge_l
from hypic_client import Hypic, Usage, doc, system

SYSTEM = system("You are a news editor. You write short, factual summaries of news articles.")
QUERY = "Summarize the news articles above in one paragraph of three or four sentences."
NO_REUSE_MODES = ("full_recompute", "prefix_cache")


@dataclass
class Summary:
    text: str
    rouge_l: float
    ttft_ms: float
    total_ms: float
    usage: Usage


def summarize(hypic: Hypic, item: SummaryItem, order: list[int], kw: dict, what: str, smoke: bool) -> Summary:
    segments = [SYSTEM, *(doc(item.passages[i], title=f"Article {i + 1}") for i in order)]
    resp = hypic.generate(segments, QUERY, **kw)
    text = require_answer(resp.text, what, smoke=smoke)
    t = resp.timings
    return Summary(text, rouge_l(text, [item.reference]), t.ttft_ms or 0.0, t.total_ms or 0.0, resp.usage)


def line(passes: list[Summary]) -> str:
    cached = sum(s.usage.cached_tokens for s in passes) / max(sum(s.usage.prompt_tokens for s in passes), 1)
    return (
        f"ROUGE-L {mean(s.rouge_l for s in passes):.3f}  mean ttft {mean(s.ttft_ms for s in passes):.0f} ms  "
        f"mean total {mean(s.total_ms for s in passes):.0f} ms  cached {cached:.0%} of prompt tokens"
    )


def main() -> None:
    p = parser(__doc__.splitlines()[0], limit=5, max_tokens=160)
    p.add_argument("--data", default=None, help=f"{MULTINEWS} or the folder holding it")
    p.add_argument("--max-passages", type=int, default=0, help="keep the first N passages (0 = all)")
    p.add_argument("--max-chars", type=int, default=0, help="clip each passage (0 = no clip)")
    p.add_argument("--no-reorder", action="store_true", help="skip the second, reordered pass")
    args = p.parse_args()
    b = budget(args)
    max_passages, max_chars = (2, 200) if args.smoke else (args.max_passages, args.max_chars)
    items = load_multinews(resolve(args.data, MULTINEWS, "Multi-News"), b.limit, max_passages, max_chars)
    kw = gen_kwargs(args, b.max_tokens)
    rows, cold, warm = [], [], []
    with client(args) as hypic:
        banner("summarize_multinews", f"{len(items)} article clusters against {args.url}")
        for n, item in enumerate(items, 1):
            order = list(range(len(item.passages)))
            cold.append(c := summarize(hypic, item, order, kw, f"cluster {n}", args.smoke))
            words = sum(len(x.split()) for x in item.passages)
            row = [n, len(item.passages), words, c.rouge_l, f"{c.ttft_ms:.0f}"]
            if not args.no_reorder:
                warm.append(w := summarize(hypic, item, order[::-1], kw, f"cluster {n} reordered", args.smoke))
                if args.mode not in NO_REUSE_MODES and w.usage.cached_tokens == 0:
                    raise ExampleFailure(f"cluster {n}: reordered passages were not served from the cache")
                row += [w.rouge_l, f"{w.ttft_ms:.0f}", f"{w.usage.cached_tokens}/{w.usage.prompt_tokens}"]
            rows.append([*row, c.text])
    headers = ["#", "passages", "words", "ROUGE-L", "ttft_ms"]
    if warm:
        headers += ["ROUGE-L_reord", "ttft_reord", "cached/prompt"]
    print(table([*headers, "summary"], rows, [*[3, 8, 6, 7, 8, 13, 10, 13][: len(headers)], 70]))
    print(f"dataset order:  {line(cold)}")
    if warm:
        print(f"reversed order: {line(warm)}")
    print(f"OK summarize_multinews: {len(rows)} clusters, ROUGE-L {mean(s.rouge_l for s in cold):.3f}")


if __name__ == "__main__":
    run(main)
