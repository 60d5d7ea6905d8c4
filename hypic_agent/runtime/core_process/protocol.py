"""The messages between the API process and the engine process (``runtime.core_process``).

Every message on the pipe is a ``list`` of items, pickled once (``Outbox``): whatever one side queued
since its last send goes as one message, so a decode step of 64 requests costs one send and one
receive, not 64 of each. Token ids, plans and results are host-side Python values; no tensor crosses.

API -> engine:

* ``Submit``: a request (``GenerationRequest`` over a ``WirePlan``), its registry hints (held by the
  engine's entry cache until the request ends) and its age, so the engine rebases its arrival time
  onto its own clock (TTFT and queue time stay measured from the HTTP arrival);
* ``Cancel``: the client went away; the scheduler frees the request at its next step;
* ``Call``: one engine or store call (``core.CALLS`` lists them); ``cid`` 0 wants no reply;
* ``Shutdown``: stop serving, close the store, exit.

engine -> API:

* ``Progress``: a start-up stage (``startup.StartupLog``'s callback, forwarded);
* ``Ready`` (``EngineFacts`` and the tokenizer, so the API process loads no model) or ``StartFailed``
  (the exception that ended the start-up, raised again in the API process);
* event tuples ``(rid, kind, payload)``: ``EVENT`` (a ``TokenEvent`` / ``FinishEvent``), ``ERROR``
  (the exception that ended the request), ``END`` (its last item), ``ADMITTED`` (ms it waited for
  admission, sent with its first event);
* ``Reply``: a ``Call``'s result or the exception it raised.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hypic_agent.runtime.prompt_pieces import PlanLike, id_tuple
from hypic_agent.runtime.scheduler.request import GenerationRequest

log = logging.getLogger("hypic.core")

EVENT, ERROR, END, ADMITTED = 0, 1, 2, 3


@dataclass(frozen=True)
class WireSegment:
    token_ids: tuple[int, ...]
    kind: str


@dataclass(frozen=True)
class WirePlan:
    """What the engine reads of a prompt plan (``PlanLike``): segments' token ids and kinds, the suffix,
    the BOS id. The plan's texts, titles and metadata stay in the API process (they reach the store as
    ``Submit.hints``)."""

    segments: tuple[WireSegment, ...]
    suffix_ids: tuple[int, ...]
    bos_id: int | None

    @classmethod
    def of(cls, plan: PlanLike) -> WirePlan:
        if isinstance(plan, WirePlan):
            return plan
        segs = tuple(WireSegment(id_tuple(s.token_ids), str(getattr(s, "kind", "text"))) for s in plan.segments)
        return cls(segs, id_tuple(plan.suffix_ids), plan.bos_id)


@dataclass(frozen=True)
class Submit:
    rid: int
    request: GenerationRequest
    age_s: float  # perf_counter() - request.t0 in the API process when it was queued for sending
    hints: Mapping[str, Any] = field(default_factory=dict)  # key -> EntryHint


@dataclass(frozen=True)
class Cancel:
    rid: int


@dataclass(frozen=True)
class Call:
    cid: int  # 0: no reply
    method: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Shutdown:
    pass


@dataclass(frozen=True)
class Progress:
    msg: str
    done: int | None = None
    total: int | None = None
    unit: str = "B"


@dataclass(frozen=True)
class Ready:
    facts: Any  # EngineFacts
    tokenizer: Any


@dataclass(frozen=True)
class StartFailed:
    error: BaseException
    traceback: str


@dataclass(frozen=True)
class Reply:
    cid: int
    ok: bool
    value: Any


def portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling with its attributes (every ``HypicError`` does: status, type,
    param, retry_after), else a ``RuntimeError`` that names it."""
    try:
        back = pickle.loads(pickle.dumps(exc))
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return back if isinstance(back, BaseException) else RuntimeError(f"{type(exc).__name__}: {exc}")


def rid_of(item: Any) -> int | None:
    """The request an outgoing item belongs to (a ``Submit`` or an event tuple), else None."""
    if isinstance(item, Submit):
        return item.rid
    if isinstance(item, tuple) and item:
        return int(item[0])
    return None


def split_sendable(items: Sequence[Any]) -> tuple[list[Any], list[tuple[Any, BaseException]]]:
    """``items`` that pickle, and those that do not with the error (checked one by one: the slow path
    after a batch failed to pickle)."""
    good: list[Any] = []
    bad: list[tuple[Any, BaseException]] = []
    for item in items:
        try:
            pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            bad.append((item, exc))
        else:
            good.append(item)
    return good, bad
