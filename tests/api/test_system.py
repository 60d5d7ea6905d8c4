"""/health, /v1/models, /metrics, request ids, queue depth and cold-segment counters."""

from __future__ import annotations

from tests.api.conftest import PARIS, doc


def test_health_models(client):
    h = client.get("/health").json()
    assert h["status"] == "ok" and h["model"] == "tiny:qwen3_5_text" and h["auth"] == "open"
    m = client.get("/v1/models").json()
    assert m["object"] == "list" and m["data"][0]["id"] == "tiny:qwen3_5_text"
    assert m["data"][0]["max_context"] > 0


def test_metrics_exposes_hypic_series(client):
    client.post("/v1/generate", json={"segments": [doc(PARIS)], "query": "q", "max_tokens": 1})
    r = client.post("/v1/generate", json={"segments": [doc(PARIS)], "query": "q", "max_tokens": 1})
    assert r.headers["x-request-id"]
    text = client.get("/metrics").text
    for name in (
        "hypic_ttft_seconds_bucket",
        "hypic_segment_hit_ratio 0.5",
        "hypic_cold_segments_total 1.0",
        'hypic_segments_total{result="hit"} 1.0',
        'hypic_tier_bytes{tier="cpu"}',
        'hypic_evictions_total{tier="disk"}',
        "hypic_queue_depth 0.0",
        'hypic_requests_total{route="/v1/generate",status="200"} 2.0',
        'hypic_tokens_total{kind="cached"}',
        "hypic_store_entries 1.0",
    ):
        assert name in text, name


def test_request_id_is_echoed(client):
    r = client.get("/health", headers={"x-request-id": "abc123"})
    assert r.headers["x-request-id"] == "abc123"


def test_unusable_request_id_is_replaced(client):
    for bad in (b"\xff\xfe", b"a b", b"x" * 500):
        r = client.get("/health", headers={"x-request-id": bad})
        assert r.status_code == 200
        rid = r.headers["x-request-id"]
        assert rid != bad.decode("latin-1") and len(rid) == 16 and rid.isalnum()
