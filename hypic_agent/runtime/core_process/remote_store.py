"""``RemoteStore``: the segment store as the API process reaches it when it lives in the engine process
(where and why: ``core``'s module doc). The ``SegmentStore`` methods the API uses, with their names
and arguments, each one call over the pipe (``EngineClient.call``); ``flush`` does not wait."""

from __future__ import annotations

from typing import Any

from hypic_agent.runtime.core_process.client import EngineClient
from hypic_agent.segments.store.entries import EntryMeta, StoreStats
from hypic_agent.segments.store.record import EntryRecord, Page


class RemoteStore:
    def __init__(self, client: EngineClient) -> None:
        self.client = client

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self.client.call(f"store.{name}", *args, **kwargs)

    def info(self, key: str, tenant: str | None = None) -> EntryRecord | None:
        return self._call("info", key, tenant)

    def stats(self) -> StoreStats:
        return self._call("stats")

    def register(self, key: str, meta: EntryMeta) -> EntryRecord:
        return self._call("register", key, meta)

    def set_policy(self, key: str, tenant: str | None = None, **kwargs: Any) -> EntryRecord | None:
        return self._call("set_policy", key, tenant, **kwargs)

    def list_entries(self, tenant: str, *, limit: int = 50, cursor: str | None = None, kind: str | None = None) -> Page:
        return self._call("list_entries", tenant, limit=limit, cursor=cursor, kind=kind)

    def delete(self, key: str, tenant: str | None = None) -> bool:
        return self._call("delete", key, tenant)

    def check_pin_room(self, tenant: str) -> None:
        self._call("check_pin_room", tenant)

    def contains(self, key: str) -> bool:
        return self._call("contains", key)

    def flush(self) -> None:
        """Ask the engine process to write buffered hits (not waited for: after every response)."""
        self.client.notify("store.flush")

    def close(self) -> None:
        """The engine process closes the store when it stops (``EngineClient.close``)."""
