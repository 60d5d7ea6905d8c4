"""POST /v1/chat/completions: OpenAI shapes, streaming with include_usage, segment boundaries."""

from __future__ import annotations

from hypic_agent.api.chat import ChatRequest, chat_to_segments
from tests.api.conftest import PARIS, ROME, doc, sse_events

SYS = "You are a careful assistant that answers from the documents."
HISTORY = [
    {"role": "system", "content": SYS},
    {"role": "user", "content": "What do you know about Paris, the capital city?"},
    {"role": "assistant", "content": "Paris is the capital of France, on the Seine."},
]


def chat(client, messages, **kw):
    body = {"model": "tiny:qwen3_5_text", "messages": messages, "max_tokens": 3, **kw}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_openai_shape_and_cached_tokens_grow_with_history(client):
    first = chat(client, [*HISTORY, {"role": "user", "content": "And its population?"}])
    assert first["object"] == "chat.completion" and first["id"].startswith("chatcmpl-")
    choice = first["choices"][0]
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] in ("stop", "length")
    u = first["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    assert u["prompt_tokens_details"]["cached_tokens"] == 0
    assert [s["kind"] for s in first["hypic"]["usage"]["segments"]] == ["system", "turn", "turn"]
    second = chat(client, [*HISTORY, {"role": "user", "content": "And its river?"}])
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_stream_with_include_usage(client):
    msgs = [*HISTORY, {"role": "user", "content": "Summarize."}]
    r = client.post(
        "/v1/chat/completions",
        json={"messages": msgs, "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}},
    )
    assert r.status_code == 200
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    usage_chunk, final = events[-2], events[-3]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["prompt_tokens"] > 0
    assert "cached_tokens" in usage_chunk["usage"]["prompt_tokens_details"]
    assert final["choices"][0]["finish_reason"] in ("stop", "length")
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(e["object"] == "chat.completion.chunk" for e in events[:-1])
    # without include_usage there is no usage chunk
    r = client.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 2, "stream": True})
    events = sse_events(r.text)
    assert all(not e.get("usage") for e in events[:-1])


def test_cache_control_blocks_and_extension_segments_are_boundaries():
    req = ChatRequest.model_validate(
        {
            "messages": [
                {
                    "role": "system",
                    "content": [
                        {"type": "text", "text": "rules", "cache_control": {"type": "ephemeral"}},
                        {"type": "text", "text": "more"},
                    ],
                },
                {"role": "user", "content": "earlier question"},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "long document", "cache_control": {"type": "ephemeral"}},
                        {"type": "text", "text": "the actual question"},
                    ],
                },
            ],
            "segments": [{"kind": "document", "text": "a retrieved doc"}],
        }
    )
    segs, query = chat_to_segments(req)
    assert [s.kind for s in segs] == ["system", "system", "document", "turn", "turn"]
    assert segs[0].text == "rules" and segs[1].text == "more"
    assert segs[4].messages[0].content == "long document"
    assert query == "the actual question"


def test_last_message_not_user_means_no_query():
    req = ChatRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}]}
    )
    segs, query = chat_to_segments(req)
    assert query is None and [s.messages[0].role for s in segs] == ["user", "assistant"]


def test_cache_control_document_is_a_hit_next_time(client):
    block = {"type": "text", "text": f"Reference document:\n{PARIS}\n{ROME}", "cache_control": {"type": "ephemeral"}}
    msgs = [{"role": "user", "content": [block, {"type": "text", "text": "Which rivers?"}]}]
    chat(client, msgs)
    again = chat(client, [{"role": "user", "content": [block, {"type": "text", "text": "Which cities?"}]}])
    segs = again["hypic"]["usage"]["segments"]
    assert len(segs) == 1 and segs[0]["hit"] is True
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_extension_segments_and_logprobs(client):
    body = chat(client, [{"role": "user", "content": "q?"}], segments=[doc(PARIS)], logprobs=True)
    assert body["hypic"]["usage"]["segments"][0]["kind"] == "document"
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == body["usage"]["completion_tokens"]
