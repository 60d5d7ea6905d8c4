"""``ChatHypic``: a LangChain chat model over ``POST /v1/generate`` with per-segment caching."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from pydantic import ConfigDict, Field, SecretStr, model_validator

from .._adapters import resolve_clients, response_metadata, sampling_kwargs
from .._async_client import AsyncHypic
from .._client import Hypic
from .._models import GenerateChunk, GenerateResponse
from ._convert import DocumentLike, documents_to_segments, messages_to_plan, usage_metadata


class ChatHypic(BaseChatModel):
    """Chat model served by hypic-agent.

    The prompt is sent as segments so the server can reuse each one from its cache wherever it
    appears: system messages -> ``system`` segments, then ``segments`` (skills, memories, refs),
    then ``documents`` (``document`` segments; tagged Documents from :class:`HypicRetriever` go by
    id), then one ``turn`` segment per earlier message; a final user message is the query.

    Example:
        ```python
        llm = ChatHypic(base_url="http://127.0.0.1:8000", max_tokens=64).bind_documents(docs)
        msg = llm.invoke([("system", "Answer from the documents."), ("human", "Capital of France?")])
        msg.usage_metadata["input_token_details"]["cache_read"]
        ```

    Per-call keyword arguments (``invoke(..., documents=[...], mode="full_recompute")``) override
    the fields of the same name.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    model_name: str | None = Field(default=None, alias="model")
    """Informational (the server serves one model); shows up in traces."""
    mode: str | None = None
    seam: float | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: list[str] | None = None
    documents: list[Any] = Field(default_factory=list)
    """Documents (LangChain Documents, str, or segments) placed before the conversation."""
    segments: list[Any] = Field(default_factory=list)
    """Extra segments (``skill()``, ``memory()``, ``ref()``...) placed before the documents."""
    document_kind: str = "document"

    client: Hypic | None = Field(default=None, exclude=True)
    async_client: AsyncHypic | None = Field(default=None, exclude=True)
    base_url: str | None = None
    api_key: SecretStr | None = None
    timeout: float | None = 60.0
    max_retries: int = 2

    @model_validator(mode="after")
    def _setup(self) -> ChatHypic:
        key = self.api_key.get_secret_value() if self.api_key else None
        self.client, self.async_client = resolve_clients(
            self.client, self.async_client, self.base_url, key, self.timeout, self.max_retries
        )
        return self

    @property
    def _llm_type(self) -> str:
        return "hypic"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        fields = ("model_name", "base_url", "mode", "seam", "max_tokens", "temperature", "top_p", "top_k")
        return {f: getattr(self, f) for f in fields}

    def bind_documents(self, documents: Sequence[DocumentLike]) -> ChatHypic:
        """A copy of this model with ``documents`` appended to the bound documents."""
        return self.model_copy(update={"documents": [*self.documents, *documents]})

    # --- request/response mapping ------------------------------------------------------------

    def _request(self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]) -> dict[str, Any]:
        documents = [*self.documents, *kwargs.get("documents", [])]
        bound = [*self.segments, *kwargs.get("segments", []), *documents_to_segments(documents, self.document_kind)]
        plan = messages_to_plan(messages, bound)
        return {
            "segments": plan.segments,
            "query": plan.query,
            "stop": stop if stop is not None else self.stop,
            **sampling_kwargs(self, kwargs),
        }

    @staticmethod
    def _result(resp: GenerateResponse) -> ChatResult:
        meta = response_metadata(resp)
        message = AIMessage(
            content=resp.text,
            usage_metadata=usage_metadata(resp.usage),
            response_metadata={**meta, "model_provider": "hypic"},
        )
        info: dict[str, Any] = {"finish_reason": resp.finish_reason}
        if resp.logprobs is not None:
            info["logprobs"] = [lp.model_dump() for lp in resp.logprobs]
        return ChatResult(generations=[ChatGeneration(message=message, generation_info=info)], llm_output=meta)

    @staticmethod
    def _chunk(chunk: GenerateChunk) -> ChatGenerationChunk:
        if not chunk.is_final:
            return ChatGenerationChunk(message=AIMessageChunk(content=chunk.text))
        resp = GenerateResponse.model_validate(chunk.model_dump(exclude_none=True))
        message = AIMessageChunk(
            content=chunk.text,
            usage_metadata=usage_metadata(resp.usage) if chunk.usage is not None else None,
            response_metadata={**response_metadata(resp), "model_provider": "hypic"},
            chunk_position="last",
        )
        return ChatGenerationChunk(message=message, generation_info={"finish_reason": chunk.finish_reason})

    # --- LangChain hooks ---------------------------------------------------------------------
    # NOTE: langchain-core 1.x reports on_llm_new_token for every chunk _stream yields; calling it
    # here too would report each token twice.

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        assert self.client is not None
        return self._result(self.client.generate(**self._request(messages, stop, kwargs)))

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        assert self.client is not None
        with self.client.generate(**self._request(messages, stop, kwargs), stream=True) as stream:
            for chunk in stream:
                yield self._chunk(chunk)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        if self.async_client is None:
            return await super()._agenerate(messages, stop, run_manager, **kwargs)
        return self._result(await self.async_client.generate(**self._request(messages, stop, kwargs)))

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        if self.async_client is None:
            async for out in super()._astream(messages, stop, run_manager, **kwargs):
                yield out
            return
        stream = await self.async_client.generate(**self._request(messages, stop, kwargs), stream=True)
        async with stream:
            async for chunk in stream:
                yield self._chunk(chunk)
