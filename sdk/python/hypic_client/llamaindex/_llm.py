"""``HypicLLM``: a LlamaIndex ``CustomLLM`` over ``POST /v1/generate`` with per-segment caching."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.custom import CustomLLM
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import ToolSelection

from .._adapters import resolve_clients, response_metadata, sampling_kwargs
from .._async_client import AsyncHypic
from .._client import Hypic
from .._models import GenerateChunk, GenerateResponse
from .._segments import system
from ._convert import messages_to_plan, nodes_to_segments
from ._tools import chat_body, chat_response, tool_kwargs, tool_selections, usage_extra, wants_chat_route


class HypicLLM(CustomLLM, FunctionCallingLLM):
    """LLM served by hypic-agent.

    ``complete(prompt)`` sends ``[system_prompt?, *segments, *documents]`` as cached segments and the
    prompt as the uncached query; ``chat(messages)`` maps system messages to ``system`` segments,
    earlier turns to ``turn`` segments and the last user message to the query. ``documents``
    accepts nodes / ``NodeWithScore`` (tagged ones from :class:`HypicRetriever` go by id), strings
    or segments. Per-call ``documents=`` / ``segments=`` / sampling keyword arguments add/override.
    Usage (with ``cached_tokens``) is in ``response.additional_kwargs``.

    Function calling (``FunctionCallingLLM``): ``chat_with_tools`` / ``predict_and_call`` / agents;
    ``chat(..., tools=[...])`` goes to ``/v1/chat/completions`` (``_tools.py``), the calls come
    back in ``message.additional_kwargs["tool_calls"]``; ``tool_required=True`` (or a
    ``tool_choice`` naming a tool) decodes under the tools' schemas, so the arguments parse.
    """

    base_url: str | None = Field(default=None, description="hypic-agent server root")
    api_key: str | None = Field(default=None, exclude=True)
    timeout: float | None = 60.0
    max_retries: int = 2
    model_name: str = "hypic"
    context_window: int = 32768
    mode: str | None = None
    seam: float | str | None = None
    max_tokens: int | None = 256
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: list[str] | None = None
    documents: list[Any] = Field(default_factory=list)
    segments: list[Any] = Field(default_factory=list)
    document_kind: str = "document"

    _client: Hypic = PrivateAttr()
    _aclient: AsyncHypic | None = PrivateAttr(default=None)

    def __init__(self, client: Hypic | None = None, async_client: AsyncHypic | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._client, self._aclient = resolve_clients(
            client, async_client, self.base_url, self.api_key, self.timeout, self.max_retries
        )

    @classmethod
    def class_name(cls) -> str:
        return "HypicLLM"

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(
            context_window=self.context_window,
            num_output=self.max_tokens or 256,
            is_chat_model=True,
            is_function_calling_model=True,
            model_name=self.model_name,
        )

    # --- request/response mapping ------------------------------------------------------------

    def _bound(self, kwargs: dict[str, Any]) -> list[Any]:
        documents = nodes_to_segments([*self.documents, *kwargs.pop("documents", [])], self.document_kind)
        return [*self.segments, *kwargs.pop("segments", []), *documents]

    def _params(self, segments: Sequence[Any], query: str | None, kwargs: dict[str, Any]) -> dict[str, Any]:
        return {"segments": list(segments), "query": query, "stop": kwargs.get("stop", self.stop)} | sampling_kwargs(
            self, kwargs
        )

    def _completion_params(self, prompt: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        head = [system(self.system_prompt)] if self.system_prompt else []
        return self._params([*head, *self._bound(kwargs)], prompt, kwargs)

    def _chat_params(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]) -> dict[str, Any]:
        if self.system_prompt and not any(m.role == MessageRole.SYSTEM for m in messages):
            messages = [ChatMessage(role=MessageRole.SYSTEM, content=self.system_prompt), *messages]
        plan = messages_to_plan(messages, self._bound(kwargs))
        return self._params(plan.segments, plan.query, kwargs)

    @staticmethod
    def _extra(resp: GenerateResponse) -> dict[str, Any]:
        return response_metadata(resp)

    @staticmethod
    def _final(chunk: GenerateChunk) -> dict[str, Any]:
        if not chunk.is_final:
            return {}
        return response_metadata(GenerateResponse.model_validate(chunk.model_dump(exclude_none=True)))

    def _chat_route_kwargs(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]) -> dict[str, Any]:
        if self.system_prompt and not any(m.role == MessageRole.SYSTEM for m in messages):
            messages = [ChatMessage(role=MessageRole.SYSTEM, content=self.system_prompt), *messages]
        body = chat_body(messages, self._bound(kwargs), kwargs)
        stop = kwargs.get("stop", self.stop)
        return {**body, **({"stop": stop} if stop else {}), **sampling_kwargs(self, kwargs)}

    # --- function calling ----------------------------------------------------------------------

    def _prepare_chat_with_tools(
        self,
        tools: Sequence[Any],
        user_msg: str | ChatMessage | None = None,
        chat_history: list[ChatMessage] | None = None,
        verbose: bool = False,
        allow_parallel_tool_calls: bool = False,
        tool_required: bool = False,
        tool_choice: Any = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        prepared = tool_kwargs(tools, user_msg, chat_history, allow_parallel_tool_calls, tool_required, tool_choice)
        return {**prepared, **kwargs}

    def get_tool_calls_from_response(
        self, response: ChatResponse, error_on_no_tool_call: bool = True, **kwargs: Any
    ) -> list[ToolSelection]:
        return tool_selections(response, error_on_no_tool_call)

    # --- completion --------------------------------------------------------------------------

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        resp = self._client.generate(**self._completion_params(prompt, kwargs))
        return CompletionResponse(text=resp.text, raw=resp.model_dump(), additional_kwargs=self._extra(resp))

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        stream = self._client.generate(**self._completion_params(prompt, kwargs), stream=True)

        def gen() -> CompletionResponseGen:
            text = ""
            with stream:
                for chunk in stream:
                    text += chunk.text
                    yield CompletionResponse(
                        text=text, delta=chunk.text, raw=chunk.model_dump(), additional_kwargs=self._final(chunk)
                    )

        return gen()

    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        if self._aclient is None:
            return self.complete(prompt, formatted=formatted, **kwargs)
        resp = await self._aclient.generate(**self._completion_params(prompt, kwargs))
        return CompletionResponse(text=resp.text, raw=resp.model_dump(), additional_kwargs=self._extra(resp))

    # --- chat (native: messages become segments, not one flattened prompt) ---------------------

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        if wants_chat_route(kwargs):
            out = self._client.chat.completions.create(**self._chat_route_kwargs(messages, kwargs))
            return chat_response(out, usage_extra(out))
        resp = self._client.generate(**self._chat_params(messages, kwargs))
        return ChatResponse(
            message=ChatMessage(role=MessageRole.ASSISTANT, content=resp.text),
            raw=resp.model_dump(),
            additional_kwargs=self._extra(resp),
        )

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        if wants_chat_route(kwargs):
            chat = self._client.chat.completions.create(**self._chat_route_kwargs(messages, kwargs), stream=True)

            def calls() -> ChatResponseGen:
                text = ""
                with chat:
                    for delta in chat.text_deltas():
                        text += delta
                        yield ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=text), delta=delta)
                final = chat.final_response()
                yield chat_response(final, usage_extra(final))

            return calls()
        stream = self._client.generate(**self._chat_params(messages, kwargs), stream=True)

        def gen() -> ChatResponseGen:
            text = ""
            with stream:
                for chunk in stream:
                    text += chunk.text
                    yield ChatResponse(
                        message=ChatMessage(role=MessageRole.ASSISTANT, content=text),
                        delta=chunk.text,
                        raw=chunk.model_dump(),
                        additional_kwargs=self._final(chunk),
                    )

        return gen()

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        if self._aclient is None:
            return self.chat(messages, **kwargs)
        if wants_chat_route(kwargs):
            out = await self._aclient.chat.completions.create(**self._chat_route_kwargs(messages, kwargs))
            return chat_response(out, usage_extra(out))
        resp = await self._aclient.generate(**self._chat_params(messages, kwargs))
        return ChatResponse(
            message=ChatMessage(role=MessageRole.ASSISTANT, content=resp.text),
            raw=resp.model_dump(),
            additional_kwargs=self._extra(resp),
        )
