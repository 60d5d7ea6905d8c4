"""``HypicRetriever`` (LlamaIndex): store retrieved nodes as server segments, tag them with their ids."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from llama_index.core.callbacks import CallbackManager
from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import BaseNode, NodeWithScore, QueryBundle

from .._adapters import check_put, resolve_clients, tagged_metadata, with_cache
from .._async_client import AsyncHypic
from .._client import Hypic
from .._models import SegmentInfo
from ._convert import HIDDEN_KEYS, as_node, node_to_segment


class HypicRetriever(BaseRetriever):
    """Wraps ``retriever`` (or fixed ``nodes``); every node it returns is stored with
    ``PUT /v1/segments`` and comes back as a ``NodeWithScore`` whose node carries
    ``metadata["hypic_segment_id"]`` / ``["hypic_tokens"]`` (excluded from LLM and embedding text).

    Example:
        ```python
        retriever = HypicRetriever(index.as_retriever(similarity_top_k=4), base_url="http://127.0.0.1:8000")
        results = retriever.retrieve("capital of France")
        llm = HypicLLM(base_url=..., documents=results)   # sent by id
        ```
    """

    def __init__(
        self,
        retriever: BaseRetriever | None = None,
        nodes: Sequence[BaseNode | NodeWithScore | str] | None = None,
        *,
        client: Hypic | None = None,
        async_client: AsyncHypic | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float | None = 60.0,
        max_retries: int = 2,
        kind: str = "document",
        title_key: str = "title",
        pin: bool | None = None,
        ttl: float | None = None,
        callback_manager: CallbackManager | None = None,
        verbose: bool = False,
    ) -> None:
        if (retriever is None) == (nodes is None):
            raise ValueError("HypicRetriever needs exactly one of `retriever` or `nodes`")
        super().__init__(callback_manager=callback_manager, verbose=verbose)
        self._retriever = retriever
        self._nodes = [n if isinstance(n, NodeWithScore) else NodeWithScore(node=as_node(n)) for n in nodes or []]
        self._client, self._aclient = resolve_clients(client, async_client, base_url, api_key, timeout, max_retries)
        self._kind, self._title_key, self._pin, self._ttl = kind, title_key, pin, ttl

    @property
    def client(self) -> Hypic:
        return self._client

    def _segments(self, results: Sequence[NodeWithScore]) -> list[Any]:
        return [with_cache(node_to_segment(r, self._kind, self._title_key), self._pin, self._ttl) for r in results]

    @staticmethod
    def _tag(results: Sequence[NodeWithScore], infos: Sequence[SegmentInfo]) -> list[NodeWithScore]:
        check_put(infos, len(results))
        out = []
        for r, info in zip(results, infos, strict=True):
            node = r.node.model_copy(deep=True)
            node.metadata = tagged_metadata(node.metadata, info)
            for keys in (node.excluded_llm_metadata_keys, node.excluded_embed_metadata_keys):
                keys.extend(k for k in HIDDEN_KEYS if k not in keys)
            out.append(NodeWithScore(node=node, score=r.score))
        return out

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        results = self._retriever.retrieve(query_bundle) if self._retriever is not None else list(self._nodes)
        if not results:
            return []
        return self._tag(results, self._client.segments.put(self._segments(results)))

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        if self._retriever is not None:
            results = await self._retriever.aretrieve(query_bundle)
        else:
            results = list(self._nodes)
        if not results:
            return []
        segments = self._segments(results)
        if self._aclient is not None:
            infos = await self._aclient.segments.put(segments)
        else:
            infos = await asyncio.to_thread(self._client.segments.put, segments)
        return self._tag(results, infos)
