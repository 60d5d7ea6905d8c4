"""LangChain RAG: ``HypicRetriever`` stores retrieved Documents as segments, ``ChatHypic`` answers.

A keyword retriever (a stand-in for any vector store retriever) picks two paragraphs of a small
built-in corpus per question. ``HypicRetriever`` wraps it: every Document it returns is stored on
the server (pre-warmed in the cache) and tagged with ``metadata["hypic_segment_id"]``, so
``ChatHypic.bind_documents(docs)`` sends them by id. Questions share paragraphs, and the cache
reads show up in LangChain's ``usage_metadata["input_token_details"]["cache_read"]``. The last
question is streamed (``llm.stream``).

    pip install './sdk/python[langchain]'
    hypic-agent serve
    python examples/langchain_rag.py
"""

from __future__ import annotations

from _common import (
    ExampleFailure,
    banner,
    budget,
    client,
    parser,
    require_answer,
    require_module,
    run,
    table,
)
from _corpus import CORPUS, QUESTIONS, top_k
from _metrics import contains_answer, f1

SYSTEM = "Answer the question from the documents in one short sentence."
NO_REUSE_MODES = ("full_recompute", "prefix_cache")


def main() -> None:
    args = parser(__doc__.splitlines()[0], limit=len(QUESTIONS), max_tokens=32).parse_args()
    b = budget(args)
    require_module("langchain_core", "langchain")

    from hypic_client.langchain import ChatHypic, HypicRetriever
    from langchain_core.callbacks import CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.messages import AIMessage
    from langchain_core.retrievers import BaseRetriever

    class KeywordRetriever(BaseRetriever):
        """Top-``k`` Documents by IDF-weighted keyword overlap with the query."""

        documents: list[Document]
        k: int = 2

        def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
            best = top_k(query, [d.page_content for d in self.documents], self.k)
            return [self.documents[i] for i, _ in best]

    corpus = [Document(page_content=text, metadata={"title": title}) for title, text in CORPUS]
    conn = {"base_url": args.url, "api_key": args.api_key, "timeout": args.timeout, "max_retries": 0}
    retriever = HypicRetriever(retriever=KeywordRetriever(documents=corpus, k=2), **conn)
    llm = ChatHypic(max_tokens=b.max_tokens, temperature=0.0, mode=args.mode, **conn)

    rows, total_cache_read = [], 0
    with client(args) as hypic:
        banner("langchain_rag", f"{min(b.limit, len(QUESTIONS))} questions against {args.url}")
        hypic.health()
    questions = QUESTIONS[: b.limit]
    for n, (question, golds) in enumerate(questions, 1):
        docs = retriever.invoke(question)
        if not docs or not all(d.metadata.get("hypic_segment_id") for d in docs):
            raise ExampleFailure(f"question {n}: the retriever returned no stored (tagged) documents")
        messages = [("system", SYSTEM), ("human", question)]
        bound = llm.bind_documents(docs)
        streamed = n == len(questions)
        if streamed:
            msg = None
            for chunk in bound.stream(messages):
                msg = chunk if msg is None else msg + chunk
        else:
            msg = bound.invoke(messages)
        if not isinstance(msg, AIMessage) or msg.usage_metadata is None:
            raise ExampleFailure(f"question {n}: no usage metadata on the answer")
        answer = require_answer(str(msg.content), f"question {n}", smoke=args.smoke)
        usage = msg.usage_metadata
        cache_read = usage.get("input_token_details", {}).get("cache_read", 0)
        total_cache_read += cache_read
        titles = ", ".join(d.metadata["title"] for d in docs)
        rows.append(
            [
                n,
                question,
                titles,
                "yes" if streamed else "no",
                answer,
                f1(answer, golds),
                contains_answer(answer, golds),
            ]
        )
        rows[-1] += [cache_read, usage["input_tokens"]]
    if args.mode not in NO_REUSE_MODES and total_cache_read == 0:
        raise ExampleFailure("no cache reads at all: stored documents were not reused")
    headers = ["#", "question", "retrieved", "stream", "answer", "F1", "acc", "cache_read", "input_tokens"]
    print(table(headers, rows, [2, 40, 30, 6, 50, 5, 4, 10, 12]))
    acc = sum(r[6] for r in rows) / len(rows)
    print(f"OK langchain_rag: {len(rows)} questions, acc {acc:.2f}, {total_cache_read} tokens read from the cache")


if __name__ == "__main__":
    run(main)
