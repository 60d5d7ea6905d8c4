"""An in-memory stand-in for the hypic-agent HTTP API, served through ``httpx.MockTransport``.

It follows the contract in DESIGN.md (generate JSON + SSE, segments CRUD with cursor pages,
OpenAI-style chat, models, health, the error envelope) closely enough to test the client and the
adapters hermetically. Tokens are whitespace words; a segment is a cache hit when its id was
stored or used before. Every request is recorded in ``requests`` (with its decoded JSON body).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import httpx


def content_id(seg: dict[str, Any]) -> str:
    payload = json.dumps({k: seg.get(k) for k in ("kind", "text", "messages")}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


def n_tokens(seg: dict[str, Any]) -> int:
    if seg.get("messages"):
        return sum(len(m["content"].split()) + 2 for m in seg["messages"])
    return len((seg.get("text") or "").split())


def error(status: int, type_: str, message: str, param: str | None = None) -> httpx.Response:
    return httpx.Response(status, json={"error": {"type": type_, "message": message, "param": param}})


def sse(events: list[dict[str, Any]]) -> httpx.Response:
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})


@dataclass
class Recorded:
    method: str
    path: str
    params: dict[str, str]
    headers: httpx.Headers
    body: Any


@dataclass
class FakeServer:
    reply: str = "Paris is the capital."
    stored: dict[str, dict[str, Any]] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)
    requests: list[Recorded] = field(default_factory=list)

    @property
    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def last(self, path: str) -> Recorded:
        return [r for r in self.requests if r.path == path][-1]

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        path = request.url.path
        self.requests.append(Recorded(request.method, path, dict(request.url.params), request.headers, body))
        if path.startswith("/v1/segments/"):
            return self.one(request.method, unquote(path.rsplit("/", 1)[1]), body)
        route = (request.method, path)
        if route == ("GET", "/health"):
            return httpx.Response(200, json={"status": "ok", "model": "tiny"})
        if route == ("GET", "/v1/models"):
            return httpx.Response(200, json={"object": "list", "data": [{"id": "tiny", "object": "model"}]})
        if route == ("POST", "/v1/generate"):
            return self.generate(body)
        if route == ("POST", "/v1/chat/completions"):
            return self.chat(body)
        if route == ("PUT", "/v1/segments"):
            return self.put(body)
        if route == ("GET", "/v1/segments"):
            return self.list(request.url.params)
        return error(404, "not_found", f"no route {request.method} {path}")

    # --- routes ------------------------------------------------------------------------------

    def resolve(self, seg: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        if "id" in seg and "text" not in seg and "messages" not in seg:
            if seg["id"] not in self.stored:
                raise KeyError(seg["id"])
            return self.stored[seg["id"]], True
        sid = content_id(seg)
        hit = sid in self.seen
        self.seen.add(sid)
        return {**seg, "id": sid, "tokens": n_tokens(seg)}, hit

    def generate(self, body: dict[str, Any]) -> httpx.Response:
        if not body.get("segments") and not body.get("query"):
            return error(400, "invalid_request", "segments must not be empty", "segments")
        used = []
        try:
            for seg in body.get("segments", []):
                entry, hit = self.resolve(seg)
                used.append({"id": entry["id"], "kind": entry.get("kind"), "tokens": entry["tokens"], "hit": hit})
        except KeyError as e:
            return error(404, "segment_not_found", f"unknown segment id {e.args[0]}; PUT it first", "segments")
        for u in used:
            u["tier"] = "gpu" if u["hit"] else None
        prompt = sum(u["tokens"] for u in used) + len((body.get("query") or "").split())
        cached = sum(u["tokens"] for u in used if u["hit"])
        words = self.reply.split(" ")[: body.get("max_tokens") or None]
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": len(words),
            "cached_tokens": cached,
            "recomputed_tokens": prompt - cached,
            "segments": used,
        }
        timings = {"ttft_ms": 1.25, "total_ms": 3.5, "prefill_ms": 0.5}
        if body.get("stream"):
            deltas = [w if i == 0 else " " + w for i, w in enumerate(words)]
            events: list[dict[str, Any]] = [
                {"id": "gen-1", "text": d, "token_id": 100 + i, "logprob": -0.5, "extra": "x"}
                for i, d in enumerate(deltas)
            ]
            events.append({"id": "gen-1", "text": "", "finish_reason": "stop", "usage": usage, "timings": timings})
            return sse(events)
        return httpx.Response(
            200,
            json={
                "id": "gen-1",
                "text": " ".join(words),
                "finish_reason": "stop",
                "usage": usage,
                "timings": timings,
                "mode": body.get("mode", "hypic"),
            },
        )

    def chat(self, body: dict[str, Any]) -> httpx.Response:
        usage = {
            "prompt_tokens": 7,
            "completion_tokens": 2,
            "total_tokens": 9,
            "prompt_tokens_details": {"cached_tokens": 5},
        }
        if body.get("stream"):
            events = [
                {"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": w}}]}
                for w in ("Hi", " there")
            ]
            events.append({"id": "c1", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": usage})
            return sse(events)
        return httpx.Response(
            200,
            json={
                "id": "c1",
                "object": "chat.completion",
                "created": 1,
                "model": body.get("model", "tiny"),
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "Hi there"}, "finish_reason": "stop"}
                ],
                "usage": usage,
                "system_fingerprint": "fp",
            },
        )

    def put(self, body: dict[str, Any]) -> httpx.Response:
        if not body or not body.get("segments"):
            return error(400, "invalid_request", "segments must not be empty", "segments")
        out = []
        for seg in body["segments"]:
            entry, _ = self.resolve(seg)
            cache = seg.get("cache") or {}
            entry = {**entry, "pin": cache.get("pin", False), "ttl": cache.get("ttl"), "tier": "cpu"}
            self.stored.setdefault(entry["id"], entry)
            out.append({k: entry[k] for k in ("id", "kind", "tokens", "pin", "tier")})
        return httpx.Response(200, json={"data": out})

    def list(self, params: httpx.QueryParams) -> httpx.Response:
        ids = sorted(self.stored)
        limit = int(params.get("limit", 20))
        after = params.get("after")
        start = ids.index(after) + 1 if after in ids else 0
        page = ids[start : start + limit]
        has_more = start + limit < len(ids)
        data = [self.public(self.stored[i]) for i in page]
        return httpx.Response(200, json={"data": data, "has_more": has_more, "next": page[-1] if has_more else None})

    def one(self, method: str, sid: str, body: Any) -> httpx.Response:
        if sid not in self.stored:
            return error(404, "segment_not_found", f"no segment {sid}", "id")
        if method == "GET":
            return httpx.Response(200, json=self.public(self.stored[sid]))
        if method == "PATCH":
            self.stored[sid].update((body or {}).get("cache", {}))
            return httpx.Response(200, json=self.public(self.stored[sid]))
        if method == "DELETE":
            del self.stored[sid]
            return httpx.Response(200, json={"id": sid, "deleted": True})
        return error(405, "method_not_allowed", method)

    @staticmethod
    def public(entry: dict[str, Any]) -> dict[str, Any]:
        return {k: entry.get(k) for k in ("id", "kind", "tokens", "tier", "pin", "ttl", "title")}
