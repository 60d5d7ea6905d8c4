"""What a caller hands the scheduler (``GenerationRequest``, validated before it is queued) and what
it gets back (``RequestHandle``: a stream of token events it can cancel)."""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from hypic_agent.runtime.results import FinishEvent, TokenEvent
from hypic_agent.runtime.sampling import SamplingParams

_IDS = itertools.count(1)


@dataclass(frozen=True)
class GenerationRequest:
    plan: Any  # a segments.prompt.plan.PromptPlan (engine.PlanLike)
    sampling: SamplingParams
    mode: str | None = None
    seam: float | str | None = None
    tenant: str = "default"
    priority: int = 0  # lower runs first; FCFS among equals
    t0: float = field(default_factory=time.perf_counter)  # arrival, for TTFT


END = object()  # the last item a sink receives
EventSink = Callable[[Any], None]  # called on the engine thread with each event, an exception, then END


class RequestHandle:
    """The stream of one submitted request: ``TokenEvent``s then one ``FinishEvent`` (or the error
    that ended it). ``cancel()`` (or closing the ``events()`` iterator early) frees its state at the
    scheduler's next step.

    Events go to a blocking queue that ``events()`` reads, or, with a ``sink``, straight to that
    callable on the engine thread (the API's event loop uses it: no thread between the engine and
    the loop). A sink must not block and must not raise."""

    def __init__(self, request: GenerationRequest, sink: EventSink | None = None) -> None:
        self.id = next(_IDS)
        self.request = request
        self._events: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._sink = sink
        self._cancel = threading.Event()
        self.admitted_at: float | None = None  # perf_counter when the scheduler took it in

    @property
    def queue_ms(self) -> float:
        """Time spent waiting for admission (so far, if still waiting)."""
        end = self.admitted_at if self.admitted_at is not None else time.perf_counter()
        return (end - self.request.t0) * 1e3

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    # -- scheduler side
    def _push(self, item: Any) -> None:
        if self._sink is None:
            self._events.put(item)
        else:
            self._sink(item)

    def put(self, ev: TokenEvent | FinishEvent) -> None:
        self._push(ev)

    def fail(self, exc: BaseException) -> None:
        self._push(exc)
        self._push(END)

    def end(self) -> None:
        self._push(END)

    # -- consumer side
    def events(self, timeout: float | None = None) -> Iterator[TokenEvent | FinishEvent]:
        """Blocking iterator over the events; re-raises the error that ended the request. Closing it
        before the end cancels the request."""
        if self._sink is not None:
            raise RuntimeError("this request's events go to its sink, not to events()")
        try:
            while True:
                item = self._events.get(timeout=timeout)
                if item is END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.cancel()  # no-op once finished; frees the state if the consumer left early
