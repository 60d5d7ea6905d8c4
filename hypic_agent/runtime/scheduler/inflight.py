"""``InflightDecode``: a decode step launched on the device whose sampled tokens the host has not
read yet (overlap scheduling, ``Settings.overlap_schedule``).

While the device runs step N, the host plans and launches step N+1: the rows of requests whose
step-N token is still on the device take it from ``sampled.ids`` inside the device's stream
(``LiveRequest.pending`` is the row), so the host never waits for a token to feed it. The host
reads step N (``Sampled.read``), runs the stop checks and streams its events after step N+1 is
queued, one step behind the device. A request that stopped at step N (EOS, a stop string) was
already given a row in step N+1: that row's token is dropped (``LiveRequest.retired``). A request
whose step-N token is its ``max_tokens``-th gets no row in step N+1 (the count is known on the host).
"""

from __future__ import annotations

from dataclasses import dataclass

from hypic_agent.runtime.scheduler.sampler import Sampled
from hypic_agent.runtime.scheduler.work import LiveRequest


@dataclass
class InflightDecode:
    lives: list[LiveRequest]  # the step's rows, in order (row i's token is sampled.ids[i])
    sampled: Sampled
