"""``EngineFacts``: what the API process needs to know of the engine in the engine process, sent once
in the ``Ready`` message: names, the context window, the pool's per-request capacity, the vocabulary
and stop ids (grammars), and the entry layout's bytes (the store budget's estimates)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EngineFacts:
    pid: int
    name: str
    fingerprint: str
    max_context: int
    device: str
    vocab_size: int
    eos_ids: tuple[int, ...]
    seq_tokens: int  # prompt + max_tokens one request may hold in the state pool (``StatePool.fits_ever``)
    entry_per_segment: int  # ``api.limits.EntrySize`` of the model's entries
    entry_per_token: int

    @classmethod
    def of(cls, engine: Any, serving: Any, entry_size: Any) -> EngineFacts:
        pool = serving.pool
        return cls(
            pid=os.getpid(),
            name=engine.name,
            fingerprint=engine.fingerprint,
            max_context=int(engine.max_context),
            device=str(engine.device),
            vocab_size=int(engine.model.config.vocab_size),
            eos_ids=tuple(engine.eos_ids),
            seq_tokens=int(pool.max_seq_pages * pool.page_size),
            entry_per_segment=int(entry_size.per_segment),
            entry_per_token=int(entry_size.per_token),
        )
