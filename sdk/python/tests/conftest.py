"""Fixtures: an in-memory fake server, recorded retry sleeps, and the real app when it exists.

Run: ``python -m pytest sdk/python/tests -q`` (from the repo root or from ``sdk/python``).

End-to-end fixtures build the real ``hypic_agent.api.create_app`` on a tiny random model in a
temp home: ``app_transport`` for the sync client (ASGITransport driven from a portal thread),
``asgi_app`` + ``app_lifespan`` for the async one with ``httpx.ASGITransport``. They skip while
the server package does not provide ``create_app``.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

SDK_ROOT = Path(__file__).resolve().parents[1]
REPO_ROOT = SDK_ROOT.parents[1]
for p in (SDK_ROOT, Path(__file__).resolve().parent):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import hypic_client  # noqa: E402
from hypic_asgi_bridge import app_sync_transport  # noqa: E402
from hypic_client import _retry  # noqa: E402
from hypic_fake_server import FakeServer  # noqa: E402

E2E_MODEL = "tiny:qwen3_5"


def pytest_configure(config: pytest.Config) -> None:
    # NOTE: registered here too so the marks are known when run under the repo root's pytest config.
    config.addinivalue_line("markers", "e2e: runs against the real hypic_agent app in-process")
    config.addinivalue_line("markers", "slow: builds a fresh virtualenv (needs PyPI)")


@pytest.fixture
def fake_server() -> FakeServer:
    return FakeServer()


@pytest.fixture
def client(fake_server: FakeServer) -> Iterator[hypic_client.Hypic]:
    with hypic_client.Hypic("http://hypic.test", api_key="sk-test", transport=fake_server.transport) as c:
        yield c


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Record retry waits instead of sleeping (sync and async)."""
    waits: list[float] = []

    async def fake_async_sleep(s: float) -> None:
        waits.append(s)

    monkeypatch.setattr(_retry, "sleep", waits.append)
    monkeypatch.setattr(_retry, "async_sleep", fake_async_sleep)
    return waits


# --- end-to-end against the real app ----------------------------------------------------------


def _create_app_or_skip(tmp_path: Path) -> Any:
    if str(REPO_ROOT) not in sys.path and (REPO_ROOT / "hypic_agent").is_dir():
        sys.path.append(str(REPO_ROOT))
    try:
        from hypic_agent import api
    except ImportError as e:
        pytest.skip(f"hypic_agent.api not importable: {e}")
    create_app = getattr(api, "create_app", None)
    if create_app is None:
        pytest.skip("hypic_agent.api has no create_app yet")
    if not inspect.signature(create_app).parameters:
        return create_app()
    from hypic_agent.config import Settings

    settings = Settings(home=tmp_path, model=E2E_MODEL, device="cpu", dtype="float32", min_cached_tokens=0)
    return create_app(settings)


@pytest.fixture
def asgi_app(tmp_path: Path) -> Any:
    """The real FastAPI app (lifespan not started: wrap async tests in ``app_lifespan``)."""
    return _create_app_or_skip(tmp_path)


@pytest.fixture
def app_transport(asgi_app: Any) -> Iterator[Any]:
    """A sync httpx transport into the real app with its lifespan running: ``Hypic(transport=...)``."""
    with app_sync_transport(asgi_app) as transport:
        yield transport


@contextlib.asynccontextmanager
async def _lifespan(app: Any) -> AsyncIterator[Any]:
    async with app.router.lifespan_context(app):
        yield app


@pytest.fixture
def app_lifespan() -> Any:
    """``async with app_lifespan(app):`` runs startup/shutdown around ``httpx.ASGITransport(app)``."""
    return _lifespan
