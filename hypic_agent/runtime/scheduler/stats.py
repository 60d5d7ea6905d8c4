"""Counters of the scheduler's work (read by ``/metrics``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SchedulerStats:
    forwards: int = 0  # runner forwards (one per step with rows)
    combine_steps: int = 0  # composed prepare work items (combine forwards or cold batches)
    decode_tokens: int = 0
    prefill_tokens: int = 0
    finished: int = 0
    cancelled: int = 0
    failed: int = 0
