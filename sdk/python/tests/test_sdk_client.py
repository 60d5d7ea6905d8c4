"""Request bodies, headers, URL handling and the small endpoints (health, models, chat)."""

from __future__ import annotations

import asyncio

import httpx
import hypic_client as hc
from hypic_fake_server import FakeServer


def test_generate_sends_only_what_was_set(client: hc.Hypic, fake_server: FakeServer):
    resp = client.generate(segments=[hc.doc("d")], query="q")
    body = fake_server.last("/v1/generate").body
    assert body == {"segments": [{"kind": "document", "text": "d"}], "query": "q", "stream": False}
    assert isinstance(resp, hc.GenerateResponse) and resp.timings.ttft_ms == 1.25
    assert resp.mode == "hypic" and resp.timings.prefill_ms == 0.5  # extra fields are kept


def test_generate_sampling_and_extra_body(client: hc.Hypic, fake_server: FakeServer):
    client.generate(
        [hc.doc("d")],
        "q",
        mode="full_recompute",
        seam=0.25,
        max_tokens=8,
        temperature=0.0,
        top_p=0.9,
        top_k=4,
        stop="\n\n",
        logprobs=True,
        extra_body={"seed": 3},
    )
    body = fake_server.last("/v1/generate").body
    assert body["stop"] == ["\n\n"] and body["seed"] == 3 and body["temperature"] == 0.0
    assert (body["mode"], body["seam"], body["max_tokens"], body["top_p"], body["top_k"], body["logprobs"]) == (
        "full_recompute",
        0.25,
        8,
        0.9,
        4,
        True,
    )


def test_headers_and_base_url(fake_server: FakeServer):
    with hc.Hypic(
        "http://hypic.test/v1/", api_key="sk-1", transport=fake_server.transport, default_headers={"X-Trace": "t"}
    ) as c:
        assert c.base_url == "http://hypic.test"
        c.health()
    r = fake_server.requests[-1]
    assert r.path == "/health"
    assert r.headers["authorization"] == "Bearer sk-1" and r.headers["x-trace"] == "t"
    assert r.headers["user-agent"].startswith("hypic-client/") and r.headers["accept"] == "application/json"
    with hc.Hypic("http://hypic.test", transport=fake_server.transport) as c:
        c.health()
    assert "authorization" not in fake_server.requests[-1].headers


def test_logprob_shapes_are_tolerated():
    for lp in ([-0.1, -0.2], [{"token": "a", "logprob": -0.1}], {"content": [{"token": "a", "logprob": -0.1}]}):
        resp = hc.GenerateResponse.model_validate({"text": "a", "logprobs": lp})
        assert resp.logprobs[0].logprob == -0.1


def test_minimal_response_parses():
    resp = hc.GenerateResponse.model_validate({"text": "x"})
    assert resp.usage.cached_tokens == 0 and resp.timings.ttft_ms is None and resp.usage.segments == []


def test_health_models_chat(client: hc.Hypic, fake_server: FakeServer):
    assert client.health().status == "ok"
    models = client.models.list()
    assert [m.id for m in models] == ["tiny"] and len(models) == 1
    comp = client.chat.completions.create(messages=[{"role": "user", "content": "hi"}], model="tiny", max_tokens=4)
    assert isinstance(comp, hc.ChatCompletion)
    assert comp.choices[0].message.content == "Hi there"
    assert comp.usage.prompt_tokens_details.cached_tokens == 5 and comp.system_fingerprint == "fp"
    assert fake_server.last("/v1/chat/completions").body == {
        "messages": [{"role": "user", "content": "hi"}],
        "stream": False,
        "model": "tiny",
        "max_tokens": 4,
    }


def test_async_endpoints(fake_server: FakeServer):
    async def go():
        async with hc.AsyncHypic("http://hypic.test", api_key="k", transport=fake_server.transport) as c:
            return (
                await c.health(),
                await c.models.list(),
                await c.generate([hc.doc("x y")], "q", max_tokens=1),
                await c.chat.completions.create(messages=[{"role": "user", "content": "hi"}]),
            )

    health, models, resp, comp = asyncio.run(go())
    assert health.status == "ok" and models.data[0].id == "tiny"
    assert resp.text == "Paris" and resp.usage.completion_tokens == 1
    assert comp.choices[0].finish_reason == "stop"
    assert fake_server.requests[0].headers["authorization"] == "Bearer k"


def test_per_request_timeout_is_forwarded():
    seen = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen.update(request.extensions["timeout"])
        return httpx.Response(200, json={"text": "x"})

    with hc.Hypic("http://hypic.test", timeout=5, transport=httpx.MockTransport(handler)) as c:
        c.generate(["d"], "q", timeout=123.0)
    assert seen["read"] == 123.0
    with hc.Hypic("http://hypic.test", timeout=5, transport=httpx.MockTransport(handler)) as c:
        c.generate(["d"], "q")
    assert seen["read"] == 5


def test_repr_and_exports():
    assert "hypic.test" in repr(hc.Hypic("http://hypic.test"))
    assert set(hc.__all__) <= set(dir(hc))
    assert all(not name.startswith("_") or name == "__version__" for name in hc.__all__)


def test_generate_passes_seam_auto(client: hc.Hypic, fake_server: FakeServer):
    client.generate([hc.doc("d")], "q", seam="auto")
    assert fake_server.last("/v1/generate").body["seam"] == "auto"
