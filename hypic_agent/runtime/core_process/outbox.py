"""``Outbox``: the one writer of a pipe end. Items queued from any thread go out in batches, one
pickled message per batch, from the outbox's sender thread.

``put`` never blocks and never touches the pipe: the engine thread hands over a decode step's events
without waiting on the socket, and the API's event loop submits without pickling a prompt or waiting
for the engine process to read. The first item after a send wakes the sender; items queued until it
runs join the same message, so a step's events (put one by one while the engine thread holds the
GIL) mostly leave as one send.

An item that cannot be pickled is handed to ``on_unsendable`` (the rest of its batch still goes);
a broken pipe (the other process is gone) stops the sender, later items are dropped, and
``on_broken`` is called once.
"""

from __future__ import annotations

import logging
import pickle
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from hypic_agent.runtime.core_process.protocol import split_sendable

log = logging.getLogger("hypic.core")


class Outbox:
    def __init__(
        self,
        conn: Connection,
        name: str,
        *,
        on_unsendable: Callable[[Any, BaseException], None] | None = None,
        on_broken: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._conn = conn
        self._items: list[Any] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self.broken = False
        self.sends = 0  # messages sent (batches): for tests and benchmarks
        self.items_sent = 0
        self._on_unsendable = on_unsendable
        self._on_broken = on_broken
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, item: Any) -> bool:
        """Queue ``item`` (any thread, never blocks); False once the outbox is closed or broken."""
        with self._lock:
            if self._closed or self.broken:
                return False
            self._items.append(item)
            if len(self._items) == 1:
                self._wake.set()
        return True

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued, then stop the sender (waits up to ``timeout``)."""
        with self._lock:
            self._closed = True
            self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            self._wake.wait()
            with self._lock:
                batch, self._items = self._items, []
                self._wake.clear()
                closing = self._closed
            if batch and not self._send(batch):
                return
            if closing:
                return

    def _send(self, batch: list[Any]) -> bool:
        try:
            data = pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:
            batch, bad = split_sendable(batch)
            for item, exc in bad:
                log.error("an item for the other process cannot be pickled (%s: %s)", type(exc).__name__, exc)
                if self._on_unsendable is not None:
                    self._on_unsendable(item, exc)
            if not batch:
                return True
            data = pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            self._conn.send_bytes(data)
        except (OSError, ValueError) as exc:  # the other end is gone (or the pipe was closed here)
            with self._lock:
                self.broken = True
                self._items.clear()
            if self._on_broken is not None:
                self._on_broken(exc)
            return False
        self.sends += 1
        self.items_sent += len(batch)
        return True
