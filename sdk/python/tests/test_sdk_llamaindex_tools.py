"""HypicLLM function calling (LlamaIndex) against the real app (tiny model)."""

from __future__ import annotations

import httpx
import hypic_client as hc
import pytest

pytest.importorskip("llama_index.core")

from hypic_client.llamaindex import HypicLLM
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.tools import FunctionTool
from pydantic import BaseModel, Field

pytestmark = pytest.mark.e2e


class Zone(BaseModel):
    zone: str = Field(pattern="^(utc|cet)$")


def clock(zone: str) -> str:
    """The time in a zone."""
    return f"12:00 {zone}"


TOOL = FunctionTool.from_defaults(fn=clock, fn_schema=Zone)


@pytest.fixture
def llm(app_transport: httpx.BaseTransport) -> HypicLLM:
    return HypicLLM(client=hc.Hypic("http://app", transport=app_transport, max_retries=0), max_tokens=120)


def test_is_a_function_calling_model(llm: HypicLLM):
    assert llm.metadata.is_function_calling_model


def test_chat_with_tools_required_and_tool_selection(llm: HypicLLM):
    resp = llm.chat_with_tools([TOOL], user_msg="Time in Paris?", tool_required=True)
    (sel,) = llm.get_tool_calls_from_response(resp)
    assert sel.tool_name == "clock" and sel.tool_id.startswith("call_")
    Zone.model_validate(sel.tool_kwargs)
    assert resp.additional_kwargs["usage"]["prompt_tokens"] > 0


def test_predict_and_call_runs_the_tool(llm: HypicLLM):
    out = llm.predict_and_call([TOOL], user_msg="Time?", tool_required=True)
    assert out.response.startswith("12:00 ")


def test_history_with_a_tool_result(llm: HypicLLM):
    call = {"id": "call_1", "type": "function", "function": {"name": "clock", "arguments": '{"zone": "utc"}'}}
    history = [
        ChatMessage(role=MessageRole.USER, content="Time?"),
        ChatMessage(role=MessageRole.ASSISTANT, content="", additional_kwargs={"tool_calls": [call]}),
        ChatMessage(role=MessageRole.TOOL, content="12:00 utc", additional_kwargs={"tool_call_id": "call_1"}),
    ]
    resp = llm.chat_with_tools([TOOL], chat_history=history, max_tokens=3)
    kinds = [s["kind"] for s in resp.additional_kwargs["hypic"]["usage"]["segments"]]
    assert kinds == ["system", "text", "turn", "turn", "turn"]  # instructions, the tool, three turns
    assert llm.get_tool_calls_from_response(resp, error_on_no_tool_call=False) == []  # 3 tokens: no call


def test_stream_chat_with_tools_ends_with_the_call(llm: HypicLLM):
    *_, last = llm.stream_chat_with_tools([TOOL], user_msg="Time?", tool_required=True)
    (sel,) = llm.get_tool_calls_from_response(last)
    assert sel.tool_name == "clock"
