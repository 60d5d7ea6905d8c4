"""ChatHypic with tools and structured output against the real app (tiny model)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import hypic_client as hc
import pytest

pytest.importorskip("langchain_core")

from hypic_client.langchain import ChatHypic
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from pydantic import BaseModel, Field

pytestmark = pytest.mark.e2e


class Weather(BaseModel):
    """Forecast for a city."""

    city: str = Field(pattern="^[a-z]{1,8}$")
    days: int = Field(ge=1, le=7)


class Clock(BaseModel):
    """The time in a zone."""

    zone: str = Field(pattern="^(utc|cet)$")


@pytest.fixture
def llm(app_transport: httpx.BaseTransport) -> ChatHypic:
    return ChatHypic(client=hc.Hypic("http://app", transport=app_transport, max_retries=0), max_tokens=120)


def test_bind_tools_forced_call(llm: ChatHypic):
    msg = llm.bind_tools([Weather, Clock], tool_choice="Clock").invoke([HumanMessage("Time in Paris?")])
    assert [c["name"] for c in msg.tool_calls] == ["Clock"]
    Clock.model_validate(msg.tool_calls[0]["args"])
    assert msg.response_metadata["finish_reason"] == "tool_calls"
    assert msg.usage_metadata is not None and msg.usage_metadata["input_tokens"] > 0


def test_bind_tools_stream_adds_up_to_the_call(llm: ChatHypic):
    bound = llm.bind_tools([Weather], tool_choice="any")
    whole = bound.invoke("Weather?")
    chunks = list(bound.stream("Weather?"))
    merged = chunks[0]
    for c in chunks[1:]:
        merged = merged + c
    assert [(c["name"], c["args"]) for c in merged.tool_calls] == [(c["name"], c["args"]) for c in whole.tool_calls]


@pytest.mark.parametrize("method", ["function_calling", "json_schema"])
def test_with_structured_output(llm: ChatHypic, method: str):
    out = llm.with_structured_output(Weather, method=method).invoke("Weather in Paris?")
    assert isinstance(out, Weather) and 1 <= out.days <= 7


def test_tool_results_and_bound_documents_go_along(llm: ChatHypic, app_transport: httpx.BaseTransport):
    docs = llm.bind_documents(["Paris is the capital of France. " * 4])
    history = [
        SystemMessage("You are an agent."),
        HumanMessage("Time in Paris?"),
        AIMessage("", tool_calls=[{"name": "Clock", "args": {"zone": "cet"}, "id": "call_1"}]),
        ToolMessage("12:00", tool_call_id="call_1"),
    ]
    msg = docs.bind_tools([Clock]).invoke(history, max_tokens=3)
    kinds = [s["kind"] for s in msg.response_metadata["hypic"]["usage"]["segments"]]
    assert kinds == ["system", "system", "text", "document", "turn", "turn", "turn"]


def test_async_bind_tools(llm: ChatHypic, asgi_app: Any, app_lifespan: Any):
    async def go():
        async with app_lifespan(asgi_app):
            aclient = hc.AsyncHypic("http://app", transport=httpx.ASGITransport(app=asgi_app), max_retries=0)
            model = ChatHypic(client=llm.client, async_client=aclient, max_tokens=120)
            return await model.bind_tools([Clock], tool_choice="Clock").ainvoke("Time?")

    msg = asyncio.run(go())
    assert [c["name"] for c in msg.tool_calls] == ["Clock"]
