"""Tools and structured output through hypic-client (sync, async, streaming) against the real app."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import hypic_client as hc
import pytest
from hypic_client._tools import output_params
from pydantic import BaseModel, Field

pytestmark = pytest.mark.e2e

MSGS = [{"role": "user", "content": "Weather in Paris?"}]


class Weather(BaseModel):
    """Forecast for a city."""

    city: str = Field(pattern="^[a-z]{1,8}$")
    days: int = Field(ge=1, le=7)


def test_wire_shapes():
    body = output_params({"tools": [Weather], "tool_choice": "Weather", "response_format": Weather})
    assert body["tools"][0]["function"]["name"] == "Weather"
    assert body["tools"][0]["function"]["description"] == "Forecast for a city."
    assert body["tools"][0]["function"]["parameters"]["required"] == ["city", "days"]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "Weather"}}
    assert body["response_format"]["json_schema"]["schema"] == Weather.model_json_schema()
    assert output_params({"tool_choice": "required"})["tool_choice"] == "required"


def test_forced_call_sync_and_stream_agree(app_transport: httpx.BaseTransport):
    with hc.Hypic("http://app", transport=app_transport, max_retries=0) as c:
        resp = c.chat.completions.create(messages=MSGS, tools=[Weather], tool_choice="Weather")
        assert resp.choices[0].finish_reason == "tool_calls"
        (call,) = resp.choices[0].message.tool_calls or []
        Weather.model_validate(call.function.parsed_arguments())
        stream = c.chat.completions.create(messages=MSGS, tools=[Weather], tool_choice="Weather", stream=True)
        final = stream.final_response()
        assert final.choices[0].finish_reason == "tool_calls"
        (streamed,) = final.choices[0].message.tool_calls or []
        assert streamed.function.parsed_arguments() == call.function.parsed_arguments()


def test_response_format_model(app_transport: httpx.BaseTransport):
    with hc.Hypic("http://app", transport=app_transport, max_retries=0) as c:
        resp = c.chat.completions.create(messages=MSGS, response_format=Weather, max_tokens=80)
        Weather.model_validate(resp.choices[0].message.parsed())
        assert c.models.retrieve(c.models.list().data[0].id).id
        with pytest.raises(hc.NotFoundError):
            c.models.retrieve("gpt-4o-mini")


def test_async_tools_and_stream(asgi_app: Any, app_lifespan: Any):
    async def go():
        async with app_lifespan(asgi_app):
            transport = httpx.ASGITransport(app=asgi_app)
            async with hc.AsyncHypic("http://app", transport=transport, max_retries=0) as c:
                whole = await c.chat.completions.create(messages=MSGS, tools=[Weather], tool_choice="required")
                stream = await c.chat.completions.create(
                    messages=MSGS, tools=[Weather], tool_choice="required", stream=True
                )
                return whole, await stream.final_response()

    whole, streamed = asyncio.run(go())
    a, b = whole.choices[0].message.tool_calls, streamed.choices[0].message.tool_calls
    assert a and b and [x.function.parsed_arguments() for x in a] == [x.function.parsed_arguments() for x in b]
