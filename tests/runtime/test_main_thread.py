"""``off_main_thread``: start-up work on a thread that exits (``runtime.main_thread``)."""

from __future__ import annotations

import threading

import pytest

from hypic_agent.runtime.main_thread import off_main_thread


def test_runs_on_another_thread_that_is_gone_after() -> None:
    seen: list[threading.Thread] = []

    def work() -> int:
        seen.append(threading.current_thread())
        return 41 + 1

    assert off_main_thread(work) == 42
    assert seen[0] is not threading.current_thread()
    assert not seen[0].is_alive()  # its OpenMP pool went with it


def test_raises_what_the_work_raised() -> None:
    def bad() -> None:
        raise ValueError("no model at /nowhere")

    with pytest.raises(ValueError, match="no model at /nowhere"):
        off_main_thread(bad)
