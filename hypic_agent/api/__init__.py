"""HTTP API (FastAPI): ``create_app()`` builds the server; see ``app.py`` and the routes."""

from hypic_agent.api.app import create_app

__all__ = ["create_app"]
