"""The router's cost model and LPT, checked by value (no processes)."""

from __future__ import annotations

import pytest

from hypic_agent.runtime.router import CostModel, lpt_assign, makespan, round_robin_assign


def test_cost_model_starts_from_its_prior_and_fits_measured_batches():
    m = CostModel(prior=(1.0, 0.02, 2e-6))
    assert m.predict(1000) == pytest.approx(1.0 + 20.0 + 2.0)
    a, b, c = 3.0, 0.05, 1e-5  # the "true" cost per segment
    batches = [[100], [2000], [500, 700], [64, 64, 64], [1500, 300], [1024], [256, 4000]]
    for lengths in batches:
        m.observe(lengths, sum(a + b * n + c * n * n for n in lengths))
    for n in (50, 800, 3000):
        assert m.predict(n) == pytest.approx(a + b * n + c * n * n, rel=0.02)
    assert m.n_observations == len(batches)


def test_lpt_beats_round_robin_on_skewed_lengths():
    m = CostModel(prior=(1.0, 0.02, 2e-6))
    lengths = [2048, 128, 128, 128, 2048, 128, 128, 128]  # two long documents, dealt to one worker by RR
    costs = [m.predict(n) for n in lengths]
    long_, short = costs[0], costs[1]
    rr = round_robin_assign(len(lengths), 4)
    assert rr == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert makespan(costs, rr) == pytest.approx(2 * long_)
    lpt = lpt_assign(costs, 4)
    assert sorted(len(g) for g in lpt) == [1, 1, 3, 3]
    assert makespan(costs, lpt) == pytest.approx(max(long_, 3 * short))
    assert makespan(costs, rr) / makespan(costs, lpt) == pytest.approx(2.0)


def test_lpt_counts_work_already_queued_per_worker():
    costs = [5.0, 4.0, 3.0]
    assert lpt_assign(costs, 2, loads=[100.0, 0.0]) == [[], [0, 1, 2]]
    assert lpt_assign(costs, 2, loads=[0.0, 6.0]) == [[0, 1], [2]]  # 4 fits on worker 0 before 6 is reached
    assert makespan(costs, [[0, 1], [2]], loads=[0.0, 6.0]) == 9.0
    with pytest.raises(ValueError):
        lpt_assign(costs, 2, loads=[0.0])
