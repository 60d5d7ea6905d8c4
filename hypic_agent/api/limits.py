"""Size limits checked at the edge, after parsing and before anything is tokenized or stored.

* text: a prompt (or, for ``PUT /v1/segments``, one segment) whose characters exceed
  ``max_context x Settings.text_chars_per_token`` cannot fit the context window however it
  tokenizes, so it is refused before the tokenizer sees it (400 ``context_length_exceeded``);
* metadata: each segment's ``metadata`` at most ``Settings.max_metadata_depth`` levels deep and
  ``Settings.max_metadata_bytes`` as JSON (400 ``invalid_request``), so nothing is stored that
  a later listing could not serialize;
* schemas: a tool's ``parameters`` and a ``response_format`` schema at most
  ``Settings.max_schema_depth`` levels deep (a grammar is compiled from them);
* stored bytes: the cache entries a request would add (``new_entry_tokens``), estimated from their
  tokens and the model's entry layout (``EntrySize``), at most ``Settings.max_request_store_bytes``
  per request (413) and ``Settings.tenant_store_bytes_per_minute`` per tenant (429)
  (``StoreBudget``), checked before anything is built or stored.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hypic_agent.config import Settings
from hypic_agent.errors import ContextLengthError, InvalidRequestError, StoreLimitError, StoreRateError
from hypic_agent.runtime.hypic.modes import mode_spec
from hypic_agent.runtime.prompt_pieces import PromptPieces, split_for
from hypic_agent.wire import json_depth


def segment_chars(seg: Any) -> int:
    """Characters of a wire segment's content (text, or its messages' contents)."""
    text = getattr(seg, "text", None)
    if text is not None:
        return len(text)
    return sum(len(m.content) for m in getattr(seg, "messages", None) or ())


def check_metadata(settings: Settings, metadata: Any, param: str) -> None:
    if not metadata:
        return
    depth = json_depth(metadata)
    if depth > settings.max_metadata_depth:
        raise InvalidRequestError(
            f"metadata nests {depth} levels deep; the limit is {settings.max_metadata_depth} "
            "(HYPIC_MAX_METADATA_DEPTH)",
            param=param,
        )
    size = len(json.dumps(metadata, ensure_ascii=False).encode())
    if size > settings.max_metadata_bytes:
        raise InvalidRequestError(
            f"metadata is {size} bytes as JSON; the limit is {settings.max_metadata_bytes} (HYPIC_MAX_METADATA_BYTES)",
            param=param,
        )


class RequestLimits:
    """The limits of one server: ``settings`` and the engine's context window."""

    def __init__(self, settings: Settings, max_context: int) -> None:
        self.settings = settings
        self.max_chars = max_context * settings.text_chars_per_token
        self.max_context = max_context

    def check_chars(self, chars: int, what: str, param: str) -> None:
        if chars > self.max_chars:
            raise ContextLengthError(
                f"{what} has {chars} characters: more than fit the context window of {self.max_context} tokens at "
                f"{self.settings.text_chars_per_token} characters per token ({self.max_chars}); refused before "
                "tokenizing: send less text (or raise HYPIC_TEXT_CHARS_PER_TOKEN)",
                param=param,
            )

    def check_segments(self, segments: Sequence[Any], *, extra_chars: int = 0, each: bool = False) -> None:
        """Metadata of every segment; text per segment (``each``, for PUT) or of the whole prompt."""
        total = extra_chars
        for i, seg in enumerate(segments):
            check_metadata(self.settings, getattr(seg, "metadata", None), f"segments.{i}.metadata")
            n = segment_chars(seg)
            if each:
                self.check_chars(n, f"segments[{i}]", f"segments.{i}")
            total += n
        if not each:
            self.check_chars(total, "the prompt", "segments")

    def check_schema(self, schema: Any, param: str) -> None:
        depth = json_depth(schema) if schema else 0
        if depth > self.settings.max_schema_depth:
            raise InvalidRequestError(
                f"the schema nests {depth} levels deep; the limit is {self.settings.max_schema_depth} "
                "(HYPIC_MAX_SCHEMA_DEPTH)",
                param=param,
            )

    def check_prompt(self, segments: Sequence[Any], texts: Iterable[str | None]) -> None:
        """A generate / chat request: its segments plus the other texts (query, messages)."""
        self.check_segments(segments, extra_chars=sum(len(t) for t in texts if t))


# --------------------------------------------------------------------------- stored bytes

AUTO_REQUEST_STORE_FLOOR = 1 << 30
"""The auto per-request cap is at least this (``Settings.max_request_store_bytes`` unset)."""
AUTO_REQUEST_SEGMENTS = 32
"""The auto per-request cap: a full context window cut into this many segments."""
AUTO_MINUTE_REQUESTS = 4
"""The auto per-tenant cap: this many auto-sized requests a minute."""


@dataclass(frozen=True)
class EntrySize:
    """An entry's payload bytes: ``per_segment`` (every linear layer's body pair ``T``, ``S`` and conv
    tail, plus the entry's scalars) + ``per_token`` x tokens (every attention layer's K and V rows and
    the token id), as ``SegmentEntry.to_tensors`` lays it out for the store."""

    per_segment: int
    per_token: int

    @classmethod
    def of_model(cls, model: Any, pair_dtype: torch.dtype) -> EntrySize:
        cfg = model.config
        itemsize = next(model.parameters()).dtype.itemsize
        t_shape, s_shape = cfg.linear_pair_shapes
        tail = cfg.linear_conv_dim * max(cfg.linear_conv_kernel_dim - 1, 0)
        pair = (math.prod(t_shape) + math.prod(s_shape)) * pair_dtype.itemsize + tail * itemsize
        per_segment, per_token = 4 + 8, 4  # seam (int32), prefill_ms (float64); token ids (int32)
        for layer in model.layers:
            if getattr(layer, "linear_attn", None) is not None:
                per_segment += pair
            else:
                k_row, v_row = layer.self_attn.k_row, layer.self_attn.v_row
                per_token += (math.prod(k_row) + math.prod(v_row)) * itemsize
        return cls(per_segment, per_token)

    def of(self, n_tokens: int) -> int:
        return self.per_segment + self.per_token * n_tokens


def _human(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


class StoreBudget:
    """Caps on the entry bytes requests add to the segment store, checked from estimates
    (``EntrySize``) before anything is built: ``per_request`` (413 ``store_limit_exceeded``) and
    ``per_minute`` per tenant in a sliding window (429 ``store_rate_limited`` with ``retry_after``);
    0 disables either. An admitted request's estimate is charged to its tenant's window at once
    (a reservation, so concurrent requests cannot overshoot together)."""

    def __init__(
        self,
        size: EntrySize,
        per_request: int,
        per_minute: int,
        clock: Callable[[], float] = time.monotonic,
        window_s: float = 60.0,
    ) -> None:
        self.size = size
        self.per_request = per_request
        self.per_minute = per_minute
        self.clock = clock
        self.window_s = window_s
        self._charged: dict[str, deque[tuple[float, int]]] = {}
        self._lock = threading.Lock()

    @classmethod
    def for_engine(cls, settings: Settings, engine: Any) -> StoreBudget:
        """The caps of ``settings`` over ``engine``'s entry sizes (auto where unset)."""
        return cls.for_size(settings, EntrySize.of_model(engine.model, engine.cold.pair_dtype), engine.max_context)

    @classmethod
    def for_size(cls, settings: Settings, size: EntrySize, max_context: int) -> StoreBudget:
        """The caps of ``settings`` over entries of ``size`` and a ``max_context`` window (auto where unset)."""
        full_window = AUTO_REQUEST_SEGMENTS * size.per_segment + max_context * size.per_token
        auto = max(AUTO_REQUEST_STORE_FLOOR, full_window)
        per_request = auto if settings.max_request_store_bytes is None else settings.max_request_store_bytes
        minute = settings.tenant_store_bytes_per_minute
        return cls(size, per_request, AUTO_MINUTE_REQUESTS * auto if minute is None else minute)

    @property
    def capped(self) -> bool:
        """Whether either cap is on (else ``admit`` checks nothing)."""
        return bool(self.per_request or self.per_minute)

    def used(self, tenant: str) -> int:
        """Bytes charged to ``tenant`` in the current window."""
        with self._lock:
            return sum(b for _, b in self._recent(tenant, self.clock()))

    def _recent(self, tenant: str, now: float) -> deque[tuple[float, int]]:
        q = self._charged.setdefault(tenant, deque())
        while q and q[0][0] <= now - self.window_s:
            q.popleft()
        return q

    def admit(self, tenant: str, token_counts: Sequence[int], param: str = "segments") -> int:
        """Charge the new entries of one request (their token counts) to ``tenant``; returns the
        estimate. Raises ``StoreLimitError`` / ``StoreRateError`` (nothing charged) over a cap."""
        estimate = sum(self.size.of(n) for n in token_counts)
        if not estimate:
            return 0
        what = (
            f"this request would add {len(token_counts)} new cache entries ({sum(token_counts)} tokens), about "
            f"{_human(estimate)} for this model"
        )
        if self.per_request and estimate > self.per_request:
            raise StoreLimitError(
                f"{what}; one request may add at most {_human(self.per_request)} (HYPIC_MAX_REQUEST_STORE_BYTES): "
                "send fewer or shorter segments per request",
                param=param,
            )
        if not self.per_minute:
            return estimate
        if estimate > self.per_minute:
            raise StoreLimitError(
                f"{what}; a tenant may add at most {_human(self.per_minute)} a minute "
                "(HYPIC_TENANT_STORE_BYTES_PER_MINUTE): send fewer or shorter segments per request",
                param=param,
            )
        now = self.clock()
        with self._lock:
            q = self._recent(tenant, now)
            used = sum(b for _, b in q)
            if used + estimate > self.per_minute:
                freed, wait = used + estimate - self.per_minute, self.window_s
                for t, b in q:  # the oldest charges leave the window first
                    freed -= b
                    if freed <= 0:
                        wait = t + self.window_s - now
                        break
                raise StoreRateError(
                    f"{what}; tenant {tenant!r} already added {_human(used)} in the last {self.window_s:.0f} s of "
                    f"its {_human(self.per_minute)} a minute (HYPIC_TENANT_STORE_BYTES_PER_MINUTE); retry later",
                    param=param,
                    retry_after=max(wait, 0.0),
                )
            q.append((now, estimate))
        return estimate


def new_entry_tokens(engine: Any, store: Any, pieces: PromptPieces, tenant: str, *, every: bool = False) -> list[int]:
    """Token counts of the entries ``pieces`` would add to ``store`` (cacheable, not stored yet, each
    key once), keyed as the engine keys them (``SeamPlanner``; ``every``: as a PUT stores every
    segment it is given). With ``seam`` ``"auto"`` / ``"blend"`` the widths are chosen with the model
    at run time, so every cacheable piece counts as new (an upper bound)."""
    if not pieces.spec.composed:
        return []
    min_tokens = engine.settings.min_cached_tokens
    if pieces.spec.seams and pieces.w in ("auto", "blend"):
        return [len(s) for s, k in zip(pieces.segs, pieces.kinds, strict=True) if k != "bos" and len(s) >= min_tokens]
    if every:
        _, keys = engine.seams.every_key(pieces, tenant)
    else:
        _, keys, _ = engine.seams.plan(pieces, tenant)
    out: list[int] = []
    seen: set[str] = set()
    for seg, key in zip(pieces.segs, keys, strict=True):
        if key is None or key in seen or store.contains(key):
            continue
        seen.add(key)
        out.append(len(seg))
    return out


def put_pieces(
    split_tokens: int, segments: Sequence[Sequence[int]], kinds: Sequence[str], mode: str, seam: float
) -> PromptPieces:
    """The pieces ``Engine.prewarm`` builds for a PUT of ``segments`` (split as a request would split them,
    ``Settings.split_segment_tokens``)."""
    spec = mode_spec(mode)
    cut = split_for(segments, kinds, spec, split_tokens)
    segs, knds = (cut.segs, cut.kinds) if cut is not None else ([tuple(s) for s in segments], list(kinds))
    return PromptPieces([tuple(s) for s in segs], list(knds), [], spec, seam, 0)
