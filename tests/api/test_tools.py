"""Tool calls in /v1/chat/completions: forced / required / none, streamed deltas, history, catalogue caching."""

from __future__ import annotations

import json

import jsonschema
import pytest

from tests.api.conftest import err, sse_events

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "pattern": "^[a-z]{1,8}$"},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "unit", "days"],
    "additionalProperties": False,
}
CLOCK = {"type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"]}


def tool(name, params, description="a tool"):
    return {"type": "function", "function": {"name": name, "description": description, "parameters": params}}


TOOLS = [tool("get_weather", WEATHER, "Weather forecast for a city"), tool("get_time", CLOCK, "The time in a zone")]
SCHEMAS = {"get_weather": WEATHER, "get_time": CLOCK}
MSGS = [{"role": "system", "content": "You are a helpful agent."}, {"role": "user", "content": "Weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
BAD_ARGS = {"name": "get_time", "arguments": "{oops"}


def post(client, **body):
    r = client.post("/v1/chat/completions", json={"messages": MSGS, "tools": TOOLS, **body})
    assert r.status_code == 200, r.text
    return r.json()


def valid_calls(calls):
    for c in calls:
        assert c["type"] == "function" and c["id"].startswith("call_")
        jsonschema.validate(json.loads(c["function"]["arguments"]), SCHEMAS[c["function"]["name"]])
    return calls


def test_forced_named_call_parses_and_validates(client):
    body = post(client, tool_choice=NAMED)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    calls = valid_calls(choice["message"]["tool_calls"])
    assert [c["function"]["name"] for c in calls] == ["get_weather"]


def test_required_without_parallel_gives_exactly_one_valid_call(client):
    body = post(client, tool_choice="required", parallel_tool_calls=False)
    calls = valid_calls(body["choices"][0]["message"]["tool_calls"])
    assert len(calls) == 1 and calls[0]["function"]["name"] in SCHEMAS


def test_stream_deltas_add_up_to_the_same_call(client):
    whole = post(client, tool_choice=NAMED)["choices"][0]["message"]["tool_calls"]
    body = {"messages": MSGS, "tools": TOOLS, "tool_choice": NAMED, "stream": True}
    r = client.post("/v1/chat/completions", json=body)
    events = [e for e in sse_events(r.text) if e != "[DONE]"]
    deltas = [d["tool_calls"] for e in events for d in [e["choices"][0]["delta"]] if "tool_calls" in d]
    assert len(deltas) == 1 and deltas[0][0]["index"] == 0
    streamed = deltas[0][0]
    assert streamed["function"] == whole[0]["function"]  # greedy: the same call, in one delta
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert not any(e["choices"][0]["delta"].get("content") for e in events)


def test_tool_choice_none_parses_nothing(client):
    body = post(client, tool_choice="none", max_tokens=8)
    msg = body["choices"][0]["message"]
    assert "tool_calls" not in msg and isinstance(msg["content"], str)
    assert body["choices"][0]["finish_reason"] in ("stop", "length")


def test_catalogue_is_one_segment_per_tool_and_hits_in_any_order(client):
    first = post(client, tool_choice=NAMED)
    segs = first["hypic"]["usage"]["segments"]
    assert [s["kind"] for s in segs] == ["system", "system", "text", "text"]  # system, instructions, 2 tools
    assert not any(s["hit"] for s in segs)
    swapped = client.post(
        "/v1/chat/completions",
        json={"messages": MSGS, "tools": TOOLS[::-1], "tool_choice": NAMED},
    ).json()
    again = swapped["hypic"]["usage"]["segments"]
    assert all(s["hit"] for s in again)
    assert [s["id"] for s in again[2:]] == [s["id"] for s in segs[2:]][::-1]
    seams = 8 * len(segs)  # hypic recomputes the default 8-token seam of each segment
    assert swapped["usage"]["prompt_tokens_details"]["cached_tokens"] == sum(s["tokens"] for s in segs) - seams


def test_history_with_calls_and_results(client):
    call = {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"zone": "utc"}'}}
    msgs = [
        *MSGS,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
    ]
    r = client.post("/v1/chat/completions", json={"messages": msgs, "tools": TOOLS, "max_tokens": 4})
    assert r.status_code == 200, r.text
    kinds = [s["kind"] for s in r.json()["hypic"]["usage"]["segments"]]
    assert kinds == ["system", "system", "text", "text", "turn", "turn", "turn"]


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, 400, "tool_choice"),
        ({"tools": None, "tool_choice": "required"}, 400, "tool_choice"),
        ({"tools": [tool("bad name!", CLOCK)]}, 422, "tools.0.function.name"),
        ({"tools": [tool("a", CLOCK), tool("a", WEATHER)]}, 400, "tools"),
        ({"tool_choice": NAMED, "response_format": {"type": "json_object"}}, 400, "response_format"),
        ({"tools": [tool("x", {"properties": {"a": {"type": "nonsense"}}})], "tool_choice": "required"}, 400, "tools"),
        ({"messages": [*MSGS, {"role": "assistant", "tool_calls": [{"function": BAD_ARGS}]}]}, 422, None),
    ],
)
def test_bad_tool_requests_get_the_envelope(client, body, status, param):
    r = client.post("/v1/chat/completions", json={"messages": MSGS, "tools": TOOLS, "max_tokens": 2, **body})
    assert r.status_code == status, r.text
    e = err(r)
    if param is not None:
        assert e["param"] == param


def distinct(calls):
    keys = [(c["function"]["name"], c["function"]["arguments"]) for c in calls]
    assert len(set(keys)) == len(keys), keys
    return calls


def test_required_with_parallel_calls_ends_without_repeats_or_leaks(client):
    body = post(client, tool_choice="required")  # parallel_tool_calls: the default (true)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None  # nothing of a call (cut off or not) is content
    calls = distinct(valid_calls(choice["message"]["tool_calls"]))
    assert 1 <= len(calls) <= 8
    assert body["usage"]["completion_tokens"] < 256  # it ended: the tiny model repeated its call, not max_tokens
    stream = client.post(
        "/v1/chat/completions", json={"messages": MSGS, "tools": TOOLS, "tool_choice": "required", "stream": True}
    )
    events = [e for e in sse_events(stream.text) if e != "[DONE]"]
    streamed = [tc for e in events for tc in e["choices"][0]["delta"].get("tool_calls") or []]
    assert [c["function"] for c in streamed] == [c["function"] for c in calls]  # each call exactly once
    assert [c["index"] for c in streamed] == list(range(len(calls)))
    assert not any(e["choices"][0]["delta"].get("content") for e in events)
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_parallel_calls_are_bounded_by_the_setting(make_client):
    c = make_client(max_parallel_tool_calls=1)
    body = post(c, tool_choice="required")
    calls = valid_calls(body["choices"][0]["message"]["tool_calls"])
    assert len(calls) == 1 and body["choices"][0]["finish_reason"] == "tool_calls"
    named = post(c, tool_choice={"type": "function", "function": {"name": calls[0]["function"]["name"]}})
    assert named["usage"]["completion_tokens"] == body["usage"]["completion_tokens"]  # one call, then the end


LOOSE = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
}


@pytest.mark.parametrize("choice", ["required", NAMED])
def test_forced_call_with_unbounded_string_and_integer_ends(make_client, choice):
    c = make_client(grammar_max_tool_string_length=16)  # the tiny model also loops in strings: bound them
    r = c.post(
        "/v1/chat/completions",
        json={"messages": MSGS, "tools": [tool("get_weather", LOOSE)], "tool_choice": choice, "max_tokens": 400},
    )
    choice_out = r.json()["choices"][0]
    assert choice_out["finish_reason"] == "tool_calls" and choice_out["message"]["content"] is None
    for call in distinct(choice_out["message"]["tool_calls"]):
        args = json.loads(call["function"]["arguments"])
        jsonschema.validate(args, LOOSE)
        assert len(args["city"]) <= 16 and abs(args["days"]) < 10**15  # the bounds ended the loops


def test_forced_call_cut_off_by_max_tokens_is_not_content(client):
    for stream in (False, True):
        r = client.post(
            "/v1/chat/completions",
            json={"messages": MSGS, "tools": TOOLS, "tool_choice": NAMED, "max_tokens": 20, "stream": stream},
        )
        if stream:
            events = [e for e in sse_events(r.text) if e != "[DONE]"]
            assert not any(e["choices"][0]["delta"].get("content") for e in events)
            assert not any(e["choices"][0]["delta"].get("tool_calls") for e in events)
            assert events[-1]["choices"][0]["finish_reason"] == "length"
        else:
            choice = r.json()["choices"][0]
            assert choice["finish_reason"] == "length"
            assert choice["message"]["content"] == "" and "tool_calls" not in choice["message"]


def test_call_arguments_keep_the_schema_key_order(client):
    calls = post(client, tool_choice=NAMED)["choices"][0]["message"]["tool_calls"]
    assert list(json.loads(calls[0]["function"]["arguments"])) == ["city", "unit", "days"]


WRITE_FILE = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "content": {"type": "string"}, "mode": {"type": "integer"}},
    "required": ["path", "content", "mode"],
}
FILE_TEXT = 'def f():\n    return "hi" \\ 1\n' + "x" * 3000  # lines, quotes, a backslash, past any string bound


def _forced_constraint(client, **body):
    """The constraint ``/v1/chat/completions`` decodes a forced call under (built as the route builds it)."""
    from hypic_agent.api.chat import ChatRequest
    from hypic_agent.api.chat_job import prepare_chat
    from tests.api.conftest import state

    req = ChatRequest.model_validate({"messages": MSGS, "max_tokens": 8, **body})
    cj = prepare_chat(state(client), req, "default")
    return cj.job.sampling.constraint(), cj


def _feed(c, text):
    for b in text.encode():
        assert c.allowed(259)[b], (text, chr(b))
        c.accept(b)


def test_a_forced_free_text_argument_keeps_escapes_and_integers_stay_bounded(make_client):
    """``write_file(content)``: the grammar of a forced call accepts a string with line breaks, quotes
    and a backslash, longer than the response_format string bound, and the call parses back to that
    text; an integer argument is still bounded (the looping-digits case ends). The same server bounds
    a response_format string."""
    from hypic_agent.tools.format import call_text
    from hypic_agent.tools.parse import parse_output

    c = make_client(grammar_max_string_length=8)
    body = {
        "tools": [tool("write_file", WRITE_FILE)],
        "tool_choice": {"type": "function", "function": {"name": "write_file"}},
    }
    con, cj = _forced_constraint(c, **body)
    call = call_text("write_file", {"path": "a.py", "content": FILE_TEXT, "mode": 420}, cj.fmt.syntax)
    _feed(con, call)
    assert con.is_finished()  # one named call, complete
    content, calls = parse_output(call, cj.fmt.syntax, cj.tools.functions)
    assert content is None and [k.name for k in calls] == ["write_file"]
    assert json.loads(calls[0].arguments) == {"path": "a.py", "content": FILE_TEXT, "mode": 420}

    con, _ = _forced_constraint(c, **body)  # a looping integer: cut at the digit bound
    _feed(con, '<tool_call>\n{"name": "write_file", "arguments": {"path": "a", "content": "b", "mode": ' + "1" * 15)
    mask = con.allowed(259)
    assert not mask[ord("1")] and mask[ord("}")]

    schema = {"type": "object", "properties": {"content": {"type": "string"}}, "required": ["content"]}
    rf = {"type": "json_schema", "json_schema": {"name": "doc", "schema": schema}}
    con, _ = _forced_constraint(c, response_format=rf)
    _feed(con, '{"content": "abcdefgh')
    mask = con.allowed(259)
    assert int(mask.sum()) == 1 and mask[ord('"')]  # response_format keeps the string bound (8 here)
