"""LlamaIndex adapters against the fake server: HypicRetriever and HypicLLM."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("llama_index.core")

import hypic_client as hc
from hypic_client.llamaindex import HypicLLM, HypicRetriever
from hypic_fake_server import FakeServer
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle, TextNode

NODES = [
    TextNode(text="Paris is the capital of France.", metadata={"title": "Paris"}),
    TextNode(text="Berlin is the capital of Germany.", metadata={"title": "Berlin"}),
]


class FixedRetriever(BaseRetriever):
    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return [NodeWithScore(node=n, score=1.0 - i / 10) for i, n in enumerate(NODES)]


def test_retriever_tags_nodes_and_hides_ids_from_prompts(client: hc.Hypic, fake_server: FakeServer):
    results = HypicRetriever(FixedRetriever(), client=client, ttl=600).retrieve("capital")
    assert [r.score for r in results] == [1.0, 0.9]
    node = results[0].node
    assert len(node.metadata["hypic_segment_id"]) == 24 and node.metadata["hypic_tokens"] == 6
    assert "hypic" not in node.get_content(metadata_mode=MetadataMode.LLM)
    assert "hypic" not in node.get_content(metadata_mode=MetadataMode.EMBED)
    assert "hypic_segment_id" not in NODES[0].metadata  # inputs are not mutated
    sent = fake_server.last("/v1/segments").body["segments"][0]
    assert sent == {"kind": "document", "text": NODES[0].text, "title": "Paris", "cache": {"ttl": 600.0}}


def test_retriever_over_fixed_nodes_and_async(fake_server: FakeServer):
    sclient = hc.Hypic("http://hypic.test", transport=fake_server.transport)
    aclient = hc.AsyncHypic("http://hypic.test", transport=fake_server.transport)
    retriever = HypicRetriever(nodes=["a plain string", NODES[1]], client=sclient, async_client=aclient)
    results = asyncio.run(retriever.aretrieve("q"))
    assert [r.node.get_content() for r in results] == ["a plain string", NODES[1].text]
    assert all("hypic_segment_id" in r.node.metadata for r in results)
    wrapped = HypicRetriever(FixedRetriever(), client=sclient)  # no async client: thread fallback
    assert len(asyncio.run(wrapped.aretrieve("q"))) == 2
    with pytest.raises(ValueError, match="exactly one"):
        HypicRetriever(client=sclient)


def test_llm_complete_sends_documents_by_id(client: hc.Hypic, fake_server: FakeServer):
    results = HypicRetriever(FixedRetriever(), client=client).retrieve("capital")
    llm = HypicLLM(client=client, documents=results[:1], system_prompt="Be brief.", max_tokens=3, mode="hypic")
    out = llm.complete("Capital of France?")
    body = fake_server.last("/v1/generate").body
    assert body["segments"] == [
        {"kind": "system", "text": "Be brief."},
        {"id": results[0].node.metadata["hypic_segment_id"]},
    ]
    assert body["query"] == "Capital of France?" and body["mode"] == "hypic" and body["max_tokens"] == 3
    assert out.text == "Paris is the"
    assert out.additional_kwargs["usage"]["cached_tokens"] == 6
    assert out.additional_kwargs["segments"][1]["hit"] is True


def test_llm_stream_complete(client: hc.Hypic):
    llm = HypicLLM(client=client, max_tokens=3)
    parts = list(llm.stream_complete("x", documents=["Paris doc"]))
    assert [p.delta for p in parts] == ["Paris", " is", " the", ""]
    assert parts[-1].text == "Paris is the"
    assert parts[-1].additional_kwargs["finish_reason"] == "stop" and parts[0].additional_kwargs == {}


def test_llm_chat_is_native(client: hc.Hypic, fake_server: FakeServer):
    llm = HypicLLM(client=client, max_tokens=2, segments=[hc.memory("user likes short answers")])
    resp = llm.chat(
        [
            ChatMessage(role=MessageRole.SYSTEM, content="sys"),
            ChatMessage(role=MessageRole.USER, content="hi"),
            ChatMessage(role=MessageRole.ASSISTANT, content="hello"),
            ChatMessage(role=MessageRole.USER, content="Capital?"),
        ]
    )
    body = fake_server.last("/v1/generate").body
    assert [s.get("kind") for s in body["segments"]] == ["system", "memory", "turn", "turn"]
    assert body["query"] == "Capital?"
    assert resp.message.content == "Paris is" and resp.message.role == MessageRole.ASSISTANT
    parts = list(llm.stream_chat([ChatMessage(role=MessageRole.USER, content="q")]))
    assert parts[-1].message.content == "Paris is" and parts[0].delta == "Paris"


def test_llm_async_and_metadata(fake_server: FakeServer):
    sclient = hc.Hypic("http://hypic.test", transport=fake_server.transport)
    aclient = hc.AsyncHypic("http://hypic.test", transport=fake_server.transport)
    llm = HypicLLM(client=sclient, async_client=aclient, max_tokens=1, context_window=4096, model_name="tiny")

    async def go():
        return await llm.acomplete("q"), await llm.achat([ChatMessage(role=MessageRole.USER, content="q")])

    comp, chat = asyncio.run(go())
    assert comp.text == "Paris" and chat.message.content == "Paris"
    meta = llm.metadata
    assert (meta.context_window, meta.num_output, meta.is_chat_model, meta.model_name) == (4096, 1, True, "tiny")


def test_llm_errors_propagate(client: hc.Hypic):
    with pytest.raises(hc.NotFoundError):
        HypicLLM(client=client, documents=[hc.ref("nope")]).complete("q")
