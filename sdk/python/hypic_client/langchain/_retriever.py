"""``HypicRetriever``: store retrieved Documents as server segments and tag them with their ids."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables.config import run_in_executor
from pydantic import ConfigDict, Field, SecretStr, model_validator

from .._adapters import check_put, resolve_clients, tagged_metadata, with_cache
from .._async_client import AsyncHypic
from .._client import Hypic
from .._models import SegmentInfo
from ._convert import document_to_segment


class HypicRetriever(BaseRetriever):
    """Wraps ``retriever`` (or a fixed ``documents`` list): every Document it returns is stored with
    ``PUT /v1/segments`` (pre-warming the server's cache) and comes back with
    ``metadata["hypic_segment_id"]`` (and ``"hypic_tokens"``). Pass the results to
    :class:`ChatHypic` (``bind_documents``) and they are sent by id, not re-sent as text.

    Example:
        ```python
        retriever = HypicRetriever(retriever=vectorstore.as_retriever(), base_url="http://127.0.0.1:8000")
        docs = retriever.invoke("capital of France")
        docs[0].metadata["hypic_segment_id"]
        ```
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    retriever: BaseRetriever | None = None
    """The retriever whose results are stored; exclusive with ``documents``."""
    documents: list[Document] | None = None
    """A fixed corpus returned for every query (e.g. an agent's skills); exclusive with ``retriever``."""
    k: int | None = None
    """Keep only the first ``k`` documents."""
    kind: str = "document"
    """Segment kind to store them as (``document``, ``skill``, ``memory``, ...)."""
    title_key: str = "title"
    """Metadata key whose value becomes the segment title."""
    pin: bool | None = None
    ttl: float | None = None

    client: Hypic | None = Field(default=None, exclude=True)
    async_client: AsyncHypic | None = Field(default=None, exclude=True)
    base_url: str | None = None
    api_key: SecretStr | None = None
    timeout: float | None = 60.0
    max_retries: int = 2

    @model_validator(mode="after")
    def _setup(self) -> HypicRetriever:
        if (self.retriever is None) == (self.documents is None):
            raise ValueError("HypicRetriever needs exactly one of `retriever=` or `documents=`")
        key = self.api_key.get_secret_value() if self.api_key else None
        self.client, self.async_client = resolve_clients(
            self.client, self.async_client, self.base_url, key, self.timeout, self.max_retries
        )
        return self

    def _segments(self, docs: Sequence[Document]) -> list[Any]:
        return [with_cache(document_to_segment(d, self.kind, self.title_key), self.pin, self.ttl) for d in docs]

    def _limit(self, docs: list[Document]) -> list[Document]:
        return docs[: self.k] if self.k is not None else docs

    @staticmethod
    def _tag(docs: Sequence[Document], infos: Sequence[SegmentInfo]) -> list[Document]:
        check_put(infos, len(docs))
        return [
            Document(page_content=d.page_content, metadata=tagged_metadata(d.metadata, info), id=d.id)
            for d, info in zip(docs, infos, strict=True)
        ]

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        if self.retriever is not None:
            docs = self.retriever.invoke(query, config={"callbacks": run_manager.get_child()})
        else:
            docs = list(self.documents or [])
        docs = self._limit(docs)
        if not docs:
            return []
        assert self.client is not None
        return self._tag(docs, self.client.segments.put(self._segments(docs)))

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun
    ) -> list[Document]:
        if self.retriever is not None:
            docs = await self.retriever.ainvoke(query, config={"callbacks": run_manager.get_child()})
        else:
            docs = list(self.documents or [])
        docs = self._limit(docs)
        if not docs:
            return []
        segments = self._segments(docs)
        if self.async_client is not None:
            infos = await self.async_client.segments.put(segments)
        else:
            assert self.client is not None
            infos = await run_in_executor(None, self.client.segments.put, segments)
        return self._tag(docs, infos)
