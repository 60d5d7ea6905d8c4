"""LangChain adapters against the fake server: HypicRetriever and ChatHypic (sync, async, streaming)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("langchain_core")

import hypic_client as hc
from hypic_client.langchain import ChatHypic, HypicRetriever
from hypic_fake_server import FakeServer
from langchain_core.callbacks import BaseCallbackHandler, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.retrievers import BaseRetriever

CORPUS = [
    Document(page_content="Paris is the capital of France.", metadata={"title": "Paris", "src": "wiki"}),
    Document(page_content="Berlin is the capital of Germany.", metadata={"title": "Berlin"}),
    Document(page_content="Tea is a drink.", metadata={}),
]


class KeywordRetriever(BaseRetriever):
    docs: list[Document]

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        return [d for d in self.docs if any(w in d.page_content.lower() for w in query.lower().split())]


class TokenCounter(BaseCallbackHandler):
    def __init__(self) -> None:
        self.tokens: list[str] = []

    def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
        self.tokens.append(token)


def test_retriever_stores_and_tags_documents(client: hc.Hypic, fake_server: FakeServer):
    retriever = HypicRetriever(retriever=KeywordRetriever(docs=CORPUS), client=client, pin=True)
    docs = retriever.invoke("capital")
    assert [d.metadata["title"] for d in docs] == ["Paris", "Berlin"]
    assert all(len(d.metadata["hypic_segment_id"]) == 24 for d in docs)
    assert docs[0].metadata["src"] == "wiki" and docs[0].metadata["hypic_tokens"] == 6
    assert "hypic_segment_id" not in CORPUS[0].metadata  # inputs are not mutated
    sent = fake_server.last("/v1/segments").body["segments"]
    assert sent[0] == {"kind": "document", "text": CORPUS[0].page_content, "title": "Paris", "cache": {"pin": True}}
    stored = client.segments.get(docs[0].metadata["hypic_segment_id"])
    assert stored.kind == "document" and stored.pin is True


def test_retriever_over_fixed_documents_with_k_and_kind(client: hc.Hypic, fake_server: FakeServer):
    retriever = HypicRetriever(documents=CORPUS, client=client, k=2, kind="skill")
    docs = retriever.invoke("anything")
    assert len(docs) == 2
    assert {s["kind"] for s in fake_server.last("/v1/segments").body["segments"]} == {"skill"}
    assert HypicRetriever(documents=[], client=client).invoke("q") == []


def test_retriever_needs_exactly_one_source(client: hc.Hypic):
    with pytest.raises(ValueError, match="exactly one"):
        HypicRetriever(client=client)
    with pytest.raises(ValueError, match="exactly one"):
        HypicRetriever(client=client, documents=CORPUS, retriever=KeywordRetriever(docs=CORPUS))


def test_retriever_async(fake_server: FakeServer):
    aclient = hc.AsyncHypic("http://hypic.test", transport=fake_server.transport)
    sclient = hc.Hypic("http://hypic.test", transport=fake_server.transport)
    retriever = HypicRetriever(retriever=KeywordRetriever(docs=CORPUS), client=sclient, async_client=aclient)
    docs = asyncio.run(retriever.ainvoke("tea"))
    assert [d.page_content for d in docs] == ["Tea is a drink."] and "hypic_segment_id" in docs[0].metadata
    fallback = HypicRetriever(documents=CORPUS[:1], client=sclient)  # no async client: runs sync in a thread
    assert asyncio.run(fallback.ainvoke("q"))[0].metadata["hypic_segment_id"]


def test_chat_maps_messages_and_documents_to_segments(client: hc.Hypic, fake_server: FakeServer):
    tagged = HypicRetriever(documents=CORPUS[:1], client=client).invoke("q")
    llm = ChatHypic(client=client, max_tokens=3, temperature=0.0, model="tiny").bind_documents([*tagged, CORPUS[2]])
    msg = llm.invoke(
        [
            SystemMessage("Answer from the documents."),
            HumanMessage("hi"),
            AIMessage("hello"),
            AIMessage("", tool_calls=[{"name": "calc", "args": {}, "id": "t1"}]),
            ToolMessage("42", tool_call_id="t1"),
            HumanMessage("Capital of France?"),
        ],
        stop=["\n"],
    )
    body = fake_server.last("/v1/generate").body
    assert body["segments"] == [
        {"kind": "system", "text": "Answer from the documents."},
        {"id": tagged[0].metadata["hypic_segment_id"]},
        {"kind": "document", "text": "Tea is a drink."},
        {"kind": "turn", "messages": [{"role": "user", "content": "hi"}]},
        {"kind": "turn", "messages": [{"role": "assistant", "content": "hello"}]},
        {"kind": "turn", "messages": [{"role": "tool", "content": "42"}]},
    ]
    assert body["query"] == "Capital of France?" and body["stop"] == ["\n"]
    assert (body["max_tokens"], body["temperature"]) == (3, 0.0)
    assert msg.content == "Paris is the"
    assert msg.usage_metadata["input_token_details"]["cache_read"] == 6
    assert msg.usage_metadata["total_tokens"] == msg.usage_metadata["input_tokens"] + 3
    assert msg.response_metadata["finish_reason"] == "stop" and msg.response_metadata["timings"]["ttft_ms"] == 1.25
    assert llm.documents and not ChatHypic(client=client).documents  # bind_documents copies


def test_chat_call_kwargs_override_fields(client: hc.Hypic, fake_server: FakeServer):
    llm = ChatHypic(client=client, mode="hypic", segments=[hc.skill("use the calculator", name="calc")])
    llm.invoke("2+2?", mode="full_recompute", seam=0, documents=["extra doc"])
    body = fake_server.last("/v1/generate").body
    assert body["mode"] == "full_recompute" and body["seam"] == 0
    assert [s.get("kind") for s in body["segments"]] == ["skill", "document"]
    assert body["query"] == "2+2?"


def test_chat_in_an_lcel_chain(client: hc.Hypic):
    prompt = ChatPromptTemplate.from_messages([("system", "Be brief."), ("human", "{question}")])
    chain = prompt | ChatHypic(client=client, max_tokens=1) | StrOutputParser()
    assert chain.invoke({"question": "Capital?"}) == "Paris"


def test_chat_stream_reports_tokens_and_usage(client: hc.Hypic):
    counter = TokenCounter()
    llm = ChatHypic(client=client, max_tokens=3).bind_documents(["Paris is the capital of France."])
    llm.invoke("warm the cache")
    chunks = list(llm.stream("Capital?", config={"callbacks": [counter]}))
    assert [c.content for c in chunks] == ["Paris", " is", " the", ""]
    assert "".join(counter.tokens) == "Paris is the" and counter.tokens[0] == "Paris"  # reported once each
    total = chunks[0]
    for c in chunks[1:]:
        total += c
    assert total.content == "Paris is the" and total.chunk_position == "last"
    assert total.usage_metadata["input_token_details"]["cache_read"] == 6
    assert total.response_metadata["finish_reason"] == "stop"


def test_chat_async_paths(fake_server: FakeServer):
    aclient = hc.AsyncHypic("http://hypic.test", transport=fake_server.transport)
    sclient = hc.Hypic("http://hypic.test", transport=fake_server.transport)
    llm = ChatHypic(client=sclient, async_client=aclient, max_tokens=2)

    async def go():
        msg = await llm.ainvoke("Capital?")
        chunks = [c async for c in llm.astream("Capital?")]
        return msg, chunks

    msg, chunks = asyncio.run(go())
    assert msg.content == "Paris is" and "".join(c.content for c in chunks) == "Paris is"
    assert chunks[-1].usage_metadata["output_tokens"] == 2
    sync_only = ChatHypic(client=sclient, max_tokens=1)  # async falls back to a thread
    assert asyncio.run(sync_only.ainvoke("x")).content == "Paris"


def test_chat_surfaces_server_errors(client: hc.Hypic):
    with pytest.raises(hc.NotFoundError):
        ChatHypic(client=client).bind_documents([hc.ref("unknown")]).invoke("q")


def test_chat_builds_its_own_clients_from_base_url():
    llm = ChatHypic(base_url="http://127.0.0.1:9/v1", api_key="sk-x", max_retries=0, timeout=1)
    assert isinstance(llm.client, hc.Hypic) and isinstance(llm.async_client, hc.AsyncHypic)
    assert llm.client.base_url == "http://127.0.0.1:9" and "sk-x" not in repr(llm)
    assert llm._llm_type == "hypic" and llm._identifying_params["max_tokens"] is None
