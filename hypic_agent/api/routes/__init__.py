"""Routers of the API: native generate, segments CRUD, OpenAI-compatible chat, system routes."""
