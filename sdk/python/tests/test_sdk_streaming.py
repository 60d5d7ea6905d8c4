"""SSE decoding and typed streams (sync and async), including split chunks and error events."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import hypic_client as hc
import pytest
from hypic_client._streaming import SSEDecoder, iter_events
from hypic_fake_server import FakeServer

FINAL = {
    "id": "g",
    "text": "",
    "finish_reason": "stop",
    "usage": {"prompt_tokens": 10, "completion_tokens": 2, "cached_tokens": 6, "recomputed_tokens": 4},
    "timings": {"ttft_ms": 2.5, "total_ms": 9.0},
}
SSE_BODY = (
    ": keep-alive\n\n"
    'data: {"id": "g", "text": "Par", "token_id": 1, "logprob": -0.25, "new_field": [1, 2]}\r\n\r\n'
    "event: message\n"
    'data: {"id": "g", "text": "is",\n'
    'data:  "token_id": 2, "logprob": -0.5}\n\n'
    f"data: {json.dumps(FINAL)}\n\n"
    "data: [DONE]\n\n"
    'data: {"text": "after done is ignored"}\n\n'
)


def pieces(body: str, size: int = 7) -> list[bytes]:
    raw = body.encode()
    return [raw[i : i + size] for i in range(0, len(raw), size)]


def sync_client(body: str, status: int = 200) -> hc.Hypic:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["accept"] == "text/event-stream"
        assert json.loads(request.content)["stream"] is True
        return httpx.Response(status, content=iter(pieces(body)), headers={"content-type": "text/event-stream"})

    return hc.Hypic("http://hypic.test", max_retries=0, transport=httpx.MockTransport(handler))


class _AsyncBytes(httpx.AsyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for c in self.chunks:
            yield c


def async_client(body: str) -> hc.AsyncHypic:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=_AsyncBytes(pieces(body)), headers={"content-type": "text/event-stream"})

    return hc.AsyncHypic("http://hypic.test", max_retries=0, transport=httpx.MockTransport(handler))


def test_decoder_follows_the_sse_rules():
    lines = [": comment", "event: delta", "id: 7", "retry: 100", "data: a", "data:b", "", "data: [DONE]"]
    events = list(iter_events(lines))
    assert [(e.event, e.id, e.retry, e.data) for e in events] == [
        ("delta", "7", 100, "a\nb"),
        (None, "7", None, "[DONE]"),
    ]
    d = SSEDecoder()
    assert d.decode("") is None and d.decode(":x") is None


def test_sync_stream_yields_typed_chunks_and_stops_at_done():
    with sync_client(SSE_BODY) as c:
        stream = c.generate([hc.doc("d")], "q", stream=True)
        chunks = list(stream)
    assert [ch.text for ch in chunks] == ["Par", "is", ""]
    assert all(isinstance(ch, hc.GenerateChunk) for ch in chunks)
    assert chunks[0].new_field == [1, 2]  # extra fields survive
    assert not chunks[0].is_final and chunks[-1].is_final
    assert chunks[-1].usage.cached_tokens == 6 and chunks[-1].timings.ttft_ms == 2.5
    assert stream.text == "Paris" and stream.response.is_closed


def test_final_response_matches_non_streaming_shape():
    with sync_client(SSE_BODY) as c:
        resp = c.generate(["d"], "q", stream=True).final_response()
    assert isinstance(resp, hc.GenerateResponse)
    assert (resp.id, resp.text, resp.finish_reason) == ("g", "Paris", "stop")
    assert resp.usage.prompt_tokens == 10 and resp.usage.total_tokens == 12
    assert [lp.logprob for lp in resp.logprobs] == [-0.25, -0.5]
    assert resp.timings.total_ms == 9.0


def test_text_deltas_and_context_manager_close():
    with sync_client(SSE_BODY) as c, c.generate(["d"], "q", stream=True) as stream:
        assert next(stream.text_deltas()) == "Par"
    assert stream.response.is_closed


def test_error_event_raises_stream_error():
    body = 'data: {"text": "a"}\n\ndata: {"error": {"type": "engine_failed", "message": "worker died"}}\n\n'
    with sync_client(body) as c:
        stream = c.generate(["d"], "q", stream=True)
        assert next(stream).text == "a"
        with pytest.raises(hc.APIStreamError) as ei:
            next(stream)
    assert ei.value.error_type == "engine_failed" and ei.value.message == "worker died"
    with sync_client('event: error\ndata: {"message": "boom"}\n\n') as c, pytest.raises(hc.APIStreamError):
        list(c.generate(["d"], "q", stream=True))


def test_bad_json_event_raises_validation_error():
    with sync_client("data: {not json}\n\n") as c, pytest.raises(hc.APIResponseValidationError):
        list(c.generate(["d"], "q", stream=True))


def test_stream_without_done_still_ends():
    with sync_client('data: {"text": "x", "finish_reason": "length"}') as c:
        assert c.generate(["d"], "q", stream=True).final_response().finish_reason == "length"


def test_stream_start_error_raises_status_error():
    env = {"error": {"type": "invalid_request", "message": "bad seam", "param": "seam"}}
    with sync_client(json.dumps(env), status=400) as c, pytest.raises(hc.BadRequestError) as ei:
        c.generate(["d"], "q", stream=True, seam=-1)
    assert ei.value.param == "seam"


def test_stream_is_retried_before_it_starts(sleeps: list[float]):
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        if len(calls) == 1:
            return httpx.Response(503)
        return httpx.Response(200, text=SSE_BODY, headers={"content-type": "text/event-stream"})

    with hc.Hypic("http://hypic.test", transport=httpx.MockTransport(handler)) as c:
        assert c.generate(["d"], "q", stream=True).final_response().text == "Paris"
    assert len(calls) == 2 and len(sleeps) == 1


def test_async_stream():
    async def go():
        async with async_client(SSE_BODY) as c:
            stream = await c.generate([hc.doc("d")], "q", stream=True)
            chunks = [ch async for ch in stream]
            stream2 = await c.generate(["d"], "q", stream=True)
            deltas = [d async for d in stream2.text_deltas()]
            resp = await (await c.generate(["d"], "q", stream=True)).final_response()
            return chunks, deltas, resp

    chunks, deltas, resp = asyncio.run(go())
    assert [c.text for c in chunks] == ["Par", "is", ""]
    assert deltas == ["Par", "is"]
    assert resp.text == "Paris" and resp.usage.cached_tokens == 6


def test_chat_completion_streams(fake_server: FakeServer, client: hc.Hypic):
    stream = client.chat.completions.create(messages=[{"role": "user", "content": "hi"}], stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Hi there"
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 5

    async def go():
        async with hc.AsyncHypic("http://hypic.test", transport=fake_server.transport) as c:
            s = await c.chat.completions.create(messages=[{"role": "user", "content": "hi"}], stream=True)
            return [x async for x in s]

    assert len(asyncio.run(go())) == 3
