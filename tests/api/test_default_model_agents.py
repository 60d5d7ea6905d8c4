"""The real models through the official ``openai`` package: the default (the shipped hybrid
``smollm2-135m-hybrid``) and SmolLM2-135M-Instruct by name, each with a forced tool call whose
arguments validate against the schema, and ``json_schema`` output that validates. Skipped where
the SmolLM2 GGUF (the hybrid's base) has not been fetched (``hypic-agent models fetch
smollm2-135m-hybrid``; README command 1 does it on first start, CI before the tests)."""

from __future__ import annotations

import json

import jsonschema
import pytest
from fastapi.testclient import TestClient

from hypic_agent.api import create_app
from hypic_agent.config import Settings
from tests.api.test_openai_clients import FORCED, MSGS, SCHEMA, TOOLS, WEATHER
from tests.runtime.test_loading_gguf import SMOL
from tests.runtime.test_shipped_hybrid import home_with_base

openai = pytest.importorskip("openai")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(SMOL is None, reason="SmolLM2 GGUF not present: `hypic-agent models fetch smollm2-135m-hybrid`"),
]


@pytest.fixture(scope="module", params=["smollm2-135m-hybrid", "smollm2-135m-instruct"])
def oai(request, tmp_path_factory):
    from hypic_agent.runtime.loader import load_engine

    home = home_with_base(tmp_path_factory.mktemp("smol-home"))  # the fetched GGUF, linked
    model = request.param
    engine = load_engine(Settings(home=home, device="cpu"), model=model)
    app = create_app(Settings(home=home, device="cpu", model=model), engine=engine)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield model, openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=client, max_retries=0)
    engine.close()


def test_forced_tool_call_on_real_models(oai):
    model, client = oai
    resp = client.chat.completions.create(model=model, messages=MSGS, tools=TOOLS, tool_choice=FORCED, max_tokens=60)
    (call,) = resp.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and resp.choices[0].finish_reason == "tool_calls"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)


def test_json_schema_on_real_models(oai):
    model, client = oai
    resp = client.chat.completions.create(model=model, messages=MSGS, response_format=SCHEMA, max_tokens=60)
    jsonschema.validate(json.loads(resp.choices[0].message.content), WEATHER)
