"""response_format, top_logprobs, /v1/completions, model names (404 model_not_found, GET /v1/models/{id})."""

from __future__ import annotations

import json

import jsonschema
import pytest

from tests.api.conftest import PARIS, doc, err, sse_events

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Z][a-z]{0,6}$"},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user"]},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}
MSGS = [{"role": "user", "content": "Describe a person as JSON."}]
SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}


def chat(client, **body):
    r = client.post("/v1/chat/completions", json={"messages": MSGS, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_json_schema_output_validates_and_stops_at_the_end(client):
    body = chat(client, response_format=SCHEMA_FORMAT, max_tokens=200)
    choice = body["choices"][0]
    jsonschema.validate(json.loads(choice["message"]["content"]), PERSON)
    assert choice["finish_reason"] == "stop"  # the grammar ended it, not max_tokens


def test_json_schema_stream_is_the_same_text(client):
    whole = chat(client, response_format=SCHEMA_FORMAT, max_tokens=200)["choices"][0]["message"]["content"]
    r = client.post(
        "/v1/chat/completions",
        json={"messages": MSGS, "response_format": SCHEMA_FORMAT, "max_tokens": 200, "stream": True},
    )
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in sse_events(r.text)[:-1] if e["choices"])
    assert text == whole


def test_without_response_format_the_tiny_model_writes_no_json(client):
    content = chat(client, max_tokens=20)["choices"][0]["message"]["content"]
    with pytest.raises(ValueError):
        json.loads(content)


def test_top_logprobs_are_sorted_and_hold_the_greedy_token(client):
    body = chat(client, logprobs=True, top_logprobs=3, max_tokens=4)
    entries = body["choices"][0]["logprobs"]["content"]
    assert len(entries) == body["usage"]["completion_tokens"] == 4
    for e in entries:
        tops = [t["logprob"] for t in e["top_logprobs"]]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        assert e["top_logprobs"][0]["token"] == e["token"] and tops[0] == pytest.approx(e["logprob"])
    stream = client.post(
        "/v1/chat/completions",
        json={"messages": MSGS, "logprobs": True, "top_logprobs": 3, "max_tokens": 4, "stream": True},
    )
    lps = [e["choices"][0]["logprobs"] for e in sse_events(stream.text)[:-1] if e["choices"][0]["logprobs"]]
    assert [x["content"][0]["top_logprobs"] for x in lps] == [e["top_logprobs"] for e in entries]


def test_completions_raw_prompt_logprobs_and_stream(client):
    r = client.post("/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 5, "logprobs": 2})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length" and len(choice["logprobs"]["tokens"]) == 5
    assert all(len(t) <= 2 for t in choice["logprobs"]["top_logprobs"])
    assert body["usage"]["prompt_tokens"] == len("Once upon a time")  # raw bytes: no chat template around it
    s = client.post(
        "/v1/completions",
        json={"prompt": "Once upon a time", "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True}},
    )
    events = sse_events(s.text)
    assert events[-1] == "[DONE]" and events[-2]["usage"]["completion_tokens"] == 5
    assert "".join(e["choices"][0]["text"] for e in events[:-2]) == choice["text"]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", {"messages": MSGS, "top_logprobs": 2}, "top_logprobs"),
        (
            "/v1/chat/completions",
            {"messages": MSGS, "response_format": {"type": "json_schema"}},
            "response_format.json_schema",
        ),
        (
            "/v1/chat/completions",
            {
                "messages": MSGS,
                "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}},
            },
            "response_format.json_schema.schema",
        ),
        ("/v1/completions", {"prompt": "x", "echo": True}, "echo"),
        ("/v1/completions", {"prompt": ["a", "b"]}, "prompt"),
    ],
)
def test_bad_output_controls_are_400(client, path, body, param):
    r = client.post(path, json=body)
    assert r.status_code == 400, r.text
    assert err(r)["param"] == param


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": MSGS}),
        ("/v1/generate", {"segments": [doc(PARIS)], "query": "q"}),
        ("/v1/completions", {"prompt": "hello"}),
    ],
)
def test_unknown_model_is_404_with_the_served_names(client, path, body):
    r = client.post(path, json={**body, "model": "gpt-4o-mini", "max_tokens": 2})
    assert r.status_code == 404
    e = err(r)
    assert e["type"] == "model_not_found" and e["param"] == "model"
    assert "'gpt-4o-mini'" in e["message"] and "'tiny:qwen3_5_text'" in e["message"]
    ok = client.post(path, json={**body, "model": "tiny:qwen3_5_text", "max_tokens": 2})
    assert ok.status_code == 200, ok.text


def test_model_by_id_and_aliases(make_client):
    c = make_client(model_aliases=["gpt-4o-mini"])
    assert c.get("/v1/models/tiny:qwen3_5_text").json()["id"] == "tiny:qwen3_5_text"
    assert [m["id"] for m in c.get("/v1/models").json()["data"]] == ["tiny:qwen3_5_text", "gpt-4o-mini"]
    assert c.get("/v1/models/gpt-4o-mini").status_code == 200
    r = c.post("/v1/chat/completions", json={"messages": MSGS, "model": "gpt-4o-mini", "max_tokens": 2})
    assert r.status_code == 200
    missing = c.get("/v1/models/llama-3")
    assert missing.status_code == 404 and err(missing)["type"] == "model_not_found"


def test_constrained_requests_decoded_in_one_batch_each_validate(client):
    from concurrent.futures import ThreadPoolExecutor

    from tests.api.conftest import state

    sched = state(client).serving.scheduler
    alone = chat(client, response_format=SCHEMA_FORMAT, max_tokens=200)["choices"][0]["message"]["content"]
    forwards = sched.stats.forwards

    def one(i: int) -> str:
        body = {"response_format": SCHEMA_FORMAT, "max_tokens": 200}
        if i % 2:  # unconstrained neighbours in the same steps must not disturb the grammar rows
            body = {"max_tokens": 30}
        return chat(client, **body)["choices"][0]["message"]["content"]

    with ThreadPoolExecutor(6) as pool:
        out = list(pool.map(one, range(6)))
    for i in range(0, 6, 2):
        assert out[i] == alone  # greedy under the grammar: the same JSON as alone
        jsonschema.validate(json.loads(out[i]), PERSON)
    assert sched.stats.forwards - forwards < 3 * len(alone) + 90  # rows shared steps


def schema_format(properties, name="out"):
    schema = {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}, schema


def test_json_schema_with_a_looping_integer_ends_at_the_digit_bound(client):
    fmt, schema = schema_format({"name": {"type": "string", "maxLength": 8}, "population": {"type": "integer"}})
    choice = chat(client, response_format=fmt, max_tokens=200)["choices"][0]
    assert choice["finish_reason"] == "stop"  # without the bound the tiny model writes digits until max_tokens
    value = json.loads(choice["message"]["content"])
    jsonschema.validate(value, schema)
    assert len(str(abs(value["population"]))) <= 15  # grammar_max_number_digits


def test_json_schema_keeps_the_schema_key_order(client):
    fmt, _ = schema_format({"zeta": {"type": "integer"}, "alpha": {"type": "boolean"}})
    content = chat(client, response_format=fmt, max_tokens=200)["choices"][0]["message"]["content"]
    assert list(json.loads(content)) == ["zeta", "alpha"]  # not sorted


def test_string_bound_is_a_setting_and_the_output_is_strict_json(make_client):
    c = make_client(grammar_max_string_length=16)
    fmt, schema = schema_format(
        {"name": {"type": "string"}, "population": {"type": "integer"}, "country": {"type": "string"}}
    )
    choice = chat(c, response_format=fmt, max_tokens=200)["choices"][0]
    assert choice["finish_reason"] == "stop"
    value = json.loads(choice["message"]["content"])  # strict: no raw control characters in strings
    jsonschema.validate(value, schema)
    assert len(value["name"]) <= 16 and len(value["country"]) <= 16


def test_json_object_is_bounded_too(make_client):
    c = make_client(grammar_max_string_length=8, grammar_max_array_items=4)
    choice = chat(c, response_format={"type": "json_object"}, max_tokens=400)["choices"][0]
    assert choice["finish_reason"] == "stop"
    value = json.loads(choice["message"]["content"])
    assert isinstance(value, dict) and len(value) <= 4 and all(len(k) <= 8 for k in value)
