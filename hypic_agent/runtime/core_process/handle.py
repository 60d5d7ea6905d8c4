"""``RemoteHandle``: a request submitted to the engine process, as the API holds it.

The same contract as the scheduler's ``RequestHandle`` (it is one): events to its sink or to
``events()``, ``cancel()``, ``queue_ms``. The client's reader thread feeds it what the engine process
sends; ``cancel()`` also tells the engine process (once, and not after the request ended). With a
``Detokenizer`` the engine sends ids only and the handle fills in the text (``core_process.detok``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from hypic_agent.runtime.core_process.detok import Detokenizer
from hypic_agent.runtime.scheduler.request import EventSink, GenerationRequest, RequestHandle


class RemoteHandle(RequestHandle):
    def __init__(
        self,
        request: GenerationRequest,
        sink: EventSink | None,
        rid: int,
        send_cancel: Callable[[int], None],
        detok: Detokenizer | None = None,
    ) -> None:
        super().__init__(request, sink)
        self.rid = rid
        self._detok = detok
        self._send_cancel = send_cancel
        self._ended = False
        self._lock = threading.Lock()

    def cancel(self) -> None:
        with self._lock:
            first = not self.cancelled and not self._ended
            super().cancel()
        if first:
            self._send_cancel(self.rid)

    # -- the client's reader thread
    def deliver(self, item: Any) -> None:
        """An event or the exception that ended the request."""
        if self._detok is None:
            self._push(item)
            return
        for ev in self._detok.events(item):
            self._push(ev)

    def admitted(self, queue_ms: float) -> None:
        self.admitted_at = self.request.t0 + queue_ms / 1e3

    def end(self) -> None:
        with self._lock:
            self._ended = True
        super().end()

    def fail(self, exc: BaseException) -> None:
        with self._lock:
            self._ended = True
        super().fail(exc)
