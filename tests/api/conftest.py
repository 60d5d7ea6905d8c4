"""API test fixtures: one tiny engine per session, a fresh store + app per test.

``make_client(**settings)`` builds an app over the shared engine and a new SQLite store in a
temp home, entered as a ``TestClient`` (lifespan runs). The engine is shared across tests; each
app re-binds its entry cache onto that test's store.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from hypic_agent.api import create_app
from hypic_agent.config import Settings
from hypic_agent.runtime.engine import Engine

TINY = "tiny:qwen3_5_text"
PARIS = "Paris is the capital of France. It lies on the Seine and has about two million people."
BERLIN = "Berlin is the capital of Germany. It lies on the Spree and has about four million people."
ROME = "Rome is the capital of Italy. It lies on the Tiber and was founded, legend says, in 753 BC."


def doc(text: str, title: str | None = None, **kw: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": "document", "text": text, **kw}
    if title:
        out["title"] = title
    return out


@pytest.fixture(scope="session")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    from hypic_agent.runtime.loader import load_engine

    home = tmp_path_factory.mktemp("engine-home")
    return load_engine(Settings(home=home, device="cpu"), model=TINY)


@pytest.fixture
def make_client(engine: Engine, tmp_path: Path) -> Iterator[Any]:
    clients: list[TestClient] = []

    def make(**overrides: Any) -> TestClient:
        home = tmp_path / f"home{len(clients)}"
        settings = Settings(home=home, device="cpu", model=TINY, **overrides)
        client = TestClient(create_app(settings, engine=engine), raise_server_exceptions=False)
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for c in clients:
        c.__exit__(None, None, None)


@pytest.fixture
def client(make_client: Any) -> TestClient:
    return make_client()


def state(client: TestClient) -> Any:
    return client.app.state.hypic  # type: ignore[attr-defined]


def store_snapshot(client: TestClient) -> dict[str, Any]:
    """Everything stored: registry rows (policy, tier, bytes) and the files of the disk tier."""
    st = state(client)
    st.store.flush()
    rows = sorted(
        (r.key, r.tenant, r.kind, r.n_tokens, r.tier, r.nbytes, r.pinned, r.ttl_s, r.checksum, r.location, r.state)
        for r in st.store.registry.records()
    )
    root = Path(st.settings.resolved_store_dir())
    files = sorted((str(p.relative_to(root)), p.stat().st_size) for p in root.rglob("*") if p.is_file())
    return {"rows": rows, "files": files, "entries": st.store.stats().entries}


def sse_events(text: str) -> list[Any]:
    """Parse an SSE body into JSON payloads; ``"[DONE]"`` stays a string."""
    out: list[Any] = []
    for block in text.split("\n\n"):
        data = [line[len("data: ") :] for line in block.splitlines() if line.startswith("data: ")]
        if not data:
            continue
        payload = "\n".join(data)
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def err(resp: Any) -> dict[str, Any]:
    body = resp.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"type", "message", "param"}, body
    assert body["error"]["message"], body
    return body["error"]
