"""``ChatHypic``: a LangChain chat model over ``POST /v1/generate`` with per-segment caching."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import LanguageModelInput
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from .._adapters import resolve_clients, response_metadata, sampling_kwargs
from .._async_client import AsyncHypic
from .._client import Hypic
from .._models import GenerateChunk, GenerateResponse
from .._tools import response_format_param
from ._convert import DocumentLike, documents_to_segments, messages_to_plan, usage_metadata
from ._tools import chat_body, chat_chunk, chat_result, format_tools, tool_choice_of, wants_chat_route


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

    Tools and structured output: ``bind_tools([...], tool_choice=...)`` and
    ``with_structured_output(Model)`` (``method="function_calling"``, the default, or
    ``"json_schema"``); such calls go to ``/v1/chat/completions`` (``_tools.py``), where forced
    calls and schemas are decoded under a grammar, so the arguments always parse.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    model_name: str | None = Field(default=None, alias="model")
    """Informational (the server serves one model); shows up in traces."""
    mode: str | None = None
    seam: float | str | None = None
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

    def bind_tools(
        self, tools: Sequence[Any], *, tool_choice: Any = None, **kwargs: Any
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind OpenAI-style tools (dicts, pydantic classes, functions, LangChain tools).
        ``tool_choice``: ``"auto"``, ``"none"``, ``"any"`` / ``"required"`` / ``True`` (a call is
        required), or a tool's name (that tool is called)."""
        formatted = format_tools(tools)
        return self.bind(tools=formatted, tool_choice=tool_choice_of(tool_choice, formatted), **kwargs)

    def with_structured_output(
        self, schema: Any, *, include_raw: bool = False, method: str = "function_calling", **kwargs: Any
    ) -> Runnable[LanguageModelInput, Any]:
        """``method="function_calling"``: a forced call of a tool made from ``schema``;
        ``"json_schema"``: ``response_format`` with the schema (the answer is the JSON)."""
        if method == "function_calling":
            return super().with_structured_output(schema, include_raw=include_raw, **kwargs)
        if method != "json_schema" or include_raw:
            raise ValueError("ChatHypic supports method='function_calling', or 'json_schema' without include_raw")
        if isinstance(schema, type) and issubclass(schema, BaseModel):
            parser: Any = PydanticOutputParser(pydantic_object=schema)
            fmt = response_format_param(schema)
        else:
            fn = convert_to_openai_tool(schema)["function"]
            parser = JsonOutputParser()
            fmt = {"type": "json_schema", "json_schema": {"name": fn["name"], "schema": fn["parameters"]}}
        return self.bind(response_format=fmt) | parser

    def _bound(self, kwargs: dict[str, Any]) -> list[Any]:
        documents = [*self.documents, *kwargs.get("documents", [])]
        return [*self.segments, *kwargs.get("segments", []), *documents_to_segments(documents, self.document_kind)]

    def _chat_request(self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]) -> dict:
        body = chat_body(messages, self._bound(kwargs), kwargs)
        stop = stop if stop is not None else self.stop
        return {**body, **({"stop": stop} if stop else {}), **sampling_kwargs(self, kwargs)}

    def _request(self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]) -> dict[str, Any]:
        bound = self._bound(kwargs)
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
        if wants_chat_route(kwargs):
            return chat_result(self.client.chat.completions.create(**self._chat_request(messages, stop, kwargs)))
        return self._result(self.client.generate(**self._request(messages, stop, kwargs)))

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        assert self.client is not None
        if wants_chat_route(kwargs):
            with self.client.chat.completions.create(**self._chat_request(messages, stop, kwargs), stream=True) as chat:
                for c in chat:
                    out = chat_chunk(c)
                    if out is not None:
                        yield out
            return
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
        if wants_chat_route(kwargs):
            body = self._chat_request(messages, stop, kwargs)
            return chat_result(await self.async_client.chat.completions.create(**body))
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
        if wants_chat_route(kwargs):
            body = self._chat_request(messages, stop, kwargs)
            chat = await self.async_client.chat.completions.create(**body, stream=True)
            async with chat:
                async for c in chat:
                    piece = chat_chunk(c)
                    if piece is not None:
                        yield piece
            return
        stream = await self.async_client.generate(**self._request(messages, stop, kwargs), stream=True)
        async with stream:
            async for chunk in stream:
                yield self._chunk(chunk)
