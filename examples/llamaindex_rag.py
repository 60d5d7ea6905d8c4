"""LlamaIndex RAG: ``HypicRetriever`` stores retrieved nodes as segments, ``HypicLLM`` answers.

A keyword retriever (a stand-in for ``index.as_retriever()``) picks two paragraphs of a small
built-in corpus per question. ``HypicRetriever`` wraps it: each retrieved node is stored on the
server (pre-warmed in the cache) and returned as a ``NodeWithScore`` tagged with
``metadata["hypic_segment_id"]``; ``HypicLLM.complete(question, documents=nodes)`` sends them by
id as document segments and the question as the query. The cache reads are in
``response.additional_kwargs["usage"]["cached_tokens"]``. The last question is streamed
(``stream_complete``).

    pip install './sdk/python[llamaindex]'
    hypic-agent serve
    python examples/llamaindex_rag.py
"""

from __future__ import annotations

from typing import Any

from _common import ExampleFailure, banner, budget, client, parser, require_answer, require_module, run, table
from _corpus import CORPUS, QUESTIONS, top_k
from _metrics import contains_answer, f1

SYSTEM = "Answer the question from the documents in one short sentence."
NO_REUSE_MODES = ("full_recompute", "prefix_cache")


def main() -> None:
    args = parser(__doc__.splitlines()[0], limit=len(QUESTIONS), max_tokens=32).parse_args()
    b = budget(args)
    require_module("llama_index.core", "llamaindex")

    from hypic_client.llamaindex import HypicLLM, HypicRetriever
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

    class KeywordRetriever(BaseRetriever):
        """Top-``k`` nodes by IDF-weighted keyword overlap with the query."""

        def __init__(self, nodes: list[TextNode], k: int = 2) -> None:
            super().__init__()
            self._nodes, self._k = nodes, k

        def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
            best = top_k(query_bundle.query_str, [n.get_content() for n in self._nodes], self._k)
            return [NodeWithScore(node=self._nodes[i], score=s) for i, s in best]

    nodes = [TextNode(text=text, metadata={"title": title}) for title, text in CORPUS]
    conn: dict[str, Any] = {"base_url": args.url, "api_key": args.api_key, "timeout": args.timeout, "max_retries": 0}
    retriever = HypicRetriever(KeywordRetriever(nodes, k=2), **conn)
    llm = HypicLLM(system_prompt=SYSTEM, max_tokens=b.max_tokens, temperature=0.0, mode=args.mode, **conn)

    with client(args) as hypic:
        banner("llamaindex_rag", f"{min(b.limit, len(QUESTIONS))} questions against {args.url}")
        hypic.health()
    rows, total_cached = [], 0
    questions = QUESTIONS[: b.limit]
    for n, (question, golds) in enumerate(questions, 1):
        results = retriever.retrieve(question)
        if not results or not all(r.node.metadata.get("hypic_segment_id") for r in results):
            raise ExampleFailure(f"question {n}: the retriever returned no stored (tagged) nodes")
        streamed = n == len(questions)
        if streamed:
            resp = None
            for chunk in llm.stream_complete(question, documents=results):
                resp = chunk  # cumulative text; the last one carries the usage
            if resp is None:
                raise ExampleFailure(f"question {n}: the stream ended without a response")
        else:
            resp = llm.complete(question, documents=results)
        usage = resp.additional_kwargs.get("usage")
        if not usage:
            raise ExampleFailure(f"question {n}: no usage on the response")
        answer = require_answer(resp.text, f"question {n}", smoke=args.smoke)
        total_cached += usage["cached_tokens"]
        titles = ", ".join(r.node.metadata["title"] for r in results)
        row = [n, question, titles, "yes" if streamed else "no", answer, f1(answer, golds)]
        rows.append([*row, contains_answer(answer, golds), usage["cached_tokens"], usage["prompt_tokens"]])
    if args.mode not in NO_REUSE_MODES and total_cached == 0:
        raise ExampleFailure("no cached tokens at all: stored nodes were not reused")
    headers = ["#", "question", "retrieved", "stream", "answer", "F1", "acc", "cached", "prompt_tokens"]
    print(table(headers, rows, [2, 40, 30, 6, 50, 5, 4, 6, 13]))
    acc = sum(r[6] for r in rows) / len(rows)
    print(f"OK llamaindex_rag: {len(rows)} questions, acc {acc:.2f}, {total_cached} tokens read from the cache")


if __name__ == "__main__":
    run(main)
