"""Counters of the scheduler's work (read by ``/metrics``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SchedulerStats:
    forwards: int = 0  # runner forwards (one per step with rows)
    overlapped_steps: int = 0  # decode steps launched before the previous step's tokens were read
    combine_steps: int = 0  # composed requests' prepare work items (a combine joined, or a share of cold builds)
    decode_tokens: int = 0
    prefill_tokens: int = 0
    finished: int = 0
    cancelled: int = 0
    failed: int = 0
    # wall time of the engine thread by kind of work (ms; synchronized where the work ends on the host)
    forward_ms: float = 0.0  # steps with decode rows or prefill chunks, with sampling
    combine_ms: float = 0.0  # steps with composed requests' combines (cold builds fused)
    cold_build_ms: float = 0.0  # steps whose HYPIC work was cold builds only (a share ahead of a combine)
    cold_built_tokens: int = 0  # cold rows built (build contexts included)

    def as_dict(self) -> dict[str, float]:
        return dict(vars(self))
