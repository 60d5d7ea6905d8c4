"""Scatter workers: processes on torch.distributed (gloo on CPU) building cold entries for rank 0.

The worker pool, its supervision and the engine's integration with real worker processes on a
tiny model (fp32, CPU); the router in ``test_router.py``, the wire format and the streamed build in
``test_scatter_wire.py``.
"""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest
import torch
import torch.multiprocessing as mp

from hypic_agent.config import Settings
from hypic_agent.runtime.hypic.build import build_entries
from hypic_agent.runtime.hypic.entry import SegmentEntry
from hypic_agent.runtime.loader import load_engine
from hypic_agent.runtime.model_loader import load_model
from hypic_agent.runtime.workers.devices import DeviceError, worker_devices
from hypic_agent.runtime.workers.pool import WorkerPool, WorkerStartError
from hypic_agent.runtime.workers.protocol import (
    entry_tensors,
)

from .conftest import rand_tokens
from .test_engine import Plan, Seg

# ---------------------------------------------------------------------- worker pool (processes, gloo)
TINY = "tiny:qwen3_5_text"


def _gone(pids: list[int]) -> bool:
    """Every pid has exited and been reaped (no /proc entry left, not even a zombie)."""
    return not any(os.path.exists(f"/proc/{p}") for p in pids)


def _segments(lengths: list[int], seed: int) -> list[tuple[int, ...]]:
    return [tuple(rand_tokens(n, seed + i)) for i, n in enumerate(lengths)]


def _assert_same_entries(got: list[SegmentEntry], ref: list[SegmentEntry]) -> None:
    assert len(got) == len(ref)
    for a, b in zip(got, ref, strict=True):
        assert a.token_ids == b.token_ids and a.seam == b.seam
        ta, tb = entry_tensors(a), entry_tensors(b)
        assert len(ta) == len(tb)
        for x, y in zip(ta, tb, strict=True):
            assert x.dtype == y.dtype == torch.float32 and x.shape == y.shape
            # 1e-6 absolute; rtol 1e-5 because how segments are packed into a batch (which differs
            # between a worker's share, a local rebuild and the reference) moves the last bits
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    settings = Settings(model=TINY, device="cpu", home=tmp_path_factory.mktemp("home"), min_cached_tokens=4)
    model, _, fingerprint = load_model(settings)
    return settings, model, fingerprint


def _local(model):
    def build(segs, seams, dt, prefix=()):
        with single_thread():
            return build_entries(model, segs, seams, pair_dtype=dt, prefix=prefix)

    return build


@contextmanager
def single_thread():
    """Workers run with one intra-op thread; rank 0's reference too, so sums are reduced alike."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


@pytest.fixture(scope="module")
def pool(tiny):
    settings, model, fingerprint = tiny
    p = WorkerPool(
        settings.model_dump_json(),
        ["cpu", "cpu"],
        model=None,
        fingerprint=fingerprint,
        layer_kinds=model.config.layer_types,
        home=torch.device("cpu"),
        local_build=_local(model),
        timeout_s=60,
        delay_s=0.5,  # each job waits before building: time for the kill test to strike mid-build
        group_delay_s=0.3,  # and after each layer group sent: time to strike mid-stream
    )
    yield p
    pids = p.pids()
    p.close()
    assert _gone(pids)


@pytest.mark.parametrize("stream_layers", [0, 1, 3])
def test_entries_built_on_two_workers_equal_local_builds(tiny, pool, stream_layers):
    """Streamed by layer groups (4 layers: whole, 4 groups of 1, groups of 3 + 1) or not, the
    entries rank 0 assembles equal local builds."""
    _, model, _ = tiny
    segs = _segments([40, 12, 25, 64, 30], seed=900)
    seams = [8, 0, 8, 8, 4]
    jobs0, groups0, transfers0 = pool.stats.jobs, pool.stats.groups, len(pool.stats.transfer_ms)
    pool.stream_layers = stream_layers
    got = pool.build(segs, seams)
    assert pool.stats.jobs - jobs0 == 2  # both workers got a share
    assert pool.stats.failures == 0 and pool.stats.rebuilt_locally == 0
    assert pool.stats.groups - groups0 == 5 * {0: 1, 1: 4, 3: 2}[stream_layers]  # (entry, group) messages
    with single_thread():
        ref = build_entries(model, segs, seams)
    _assert_same_entries(got, ref)
    assert len(pool.stats.transfer_ms) - transfers0 == 5  # one transfer time per entry, its groups summed
    assert pool.cost.n_observations >= 2  # the cost model was refitted to the measured batches


def test_a_worker_killed_mid_stream_leaves_no_half_built_entry(tiny, pool):
    """Some of an entry's layer groups have arrived when its worker dies: they are dropped, the entry
    is rebuilt on rank 0 whole, and nothing half-received is handed out."""
    _, model, _ = tiny
    pool.stream_layers = 1
    seg, seam = _segments([52], seed=3100), [8]
    (target,) = [w for w, g in zip(pool.alive(), pool.assign([52], pool.alive()), strict=True) if g]
    victim = pool.workers[target].proc.pid
    groups0, failures0, entries0 = pool.stats.groups, pool.stats.failures, pool.stats.entries
    rebuilt0, restarts0 = pool.stats.rebuilt_locally, pool.stats.restarts
    with ThreadPoolExecutor(1) as ex:
        fut = ex.submit(pool.build, seg, seam)
        deadline = time.monotonic() + 20
        while pool.stats.groups == groups0 and time.monotonic() < deadline:  # the first group is in
            time.sleep(0.01)
        os.kill(victim, signal.SIGKILL)  # the next group comes 0.3 s later
        got = fut.result(timeout=60)
    assert 1 <= pool.stats.groups - groups0 < 4  # mid-stream: some of the 4 groups arrived, not all
    assert pool.stats.failures == failures0 + 1 and pool.stats.rebuilt_locally == rebuilt0 + 1
    assert pool.stats.entries == entries0  # no entry came back from the dead worker
    with single_thread():
        _assert_same_entries(got, build_entries(model, seg, seam))
    deadline = time.monotonic() + 60
    while pool.stats.restarts == restarts0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pool.alive() == [0, 1] and _gone([victim])


def test_kill_9_mid_build_still_gives_the_entries_and_the_worker_comes_back(tiny, pool):
    _, model, _ = tiny
    segs = _segments([48, 20, 36, 28], seed=1300)
    seams = [8, 8, 8, 8]
    victim = pool.workers[0].proc.pid
    failures0, restarts0, jobs0 = pool.stats.failures, pool.stats.restarts, pool.stats.jobs
    with ThreadPoolExecutor(1) as ex:
        fut = ex.submit(pool.build, segs, seams)
        deadline = time.monotonic() + 20
        while pool.stats.jobs < jobs0 + 2 and time.monotonic() < deadline:  # both jobs sent, workers asleep
            time.sleep(0.01)
        os.kill(victim, signal.SIGKILL)
        got = fut.result(timeout=60)
    with single_thread():
        ref = build_entries(model, segs, seams)
    _assert_same_entries(got, ref)
    assert pool.stats.failures == failures0 + 1
    assert pool.stats.rebuilt_locally >= 1
    deadline = time.monotonic() + 60
    while pool.stats.restarts == restarts0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pool.stats.restarts == restarts0 + 1
    assert pool.alive() == [0, 1]
    assert pool.workers[0].proc.pid != victim and _gone([victim])
    # the restarted worker builds again
    entries0 = pool.stats.entries
    more = _segments([33, 17], seed=1700)
    got = pool.build(more, [8, 8])
    assert pool.stats.entries == entries0 + 2
    with single_thread():
        _assert_same_entries(got, build_entries(model, more, [8, 8]))


def _wait(cond, what: str, timeout_s: float = 120.0) -> None:
    """Poll ``cond`` until it holds; fail with ``what`` after ``timeout_s`` (a bound, not a timing assert)."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_a_worker_killed_while_idle_gets_no_job_and_a_failed_restart_is_tried_again(tiny, pool, monkeypatch):
    """kill -9 between builds: the next build sends the dead worker nothing (its share goes to the live
    worker, nothing is rebuilt on rank 0), and its restart, whose first try fails, is tried again
    until the worker is back (it used to stay dead for good after one failed restart)."""
    _, model, _ = tiny
    w = pool.workers[1]
    real_start = type(w).start
    tries: list[int] = []

    def first_try_fails(launch):
        tries.append(1)
        return "injected: the new process died while loading" if len(tries) == 1 else real_start(w, launch)

    monkeypatch.setattr(w, "start", first_try_fails)
    monkeypatch.setattr(pool, "restart_backoff_s", 0.1)
    failures0, restarts0, rebuilt0 = pool.stats.failures, pool.stats.restarts, pool.stats.rebuilt_locally
    refails0, entries0 = pool.stats.restart_failures, pool.stats.entries
    victim = w.proc.pid
    os.kill(victim, signal.SIGKILL)
    _wait(lambda: not w.proc.is_alive(), "the killed worker to exit", 20)
    assert pool.alive() == [0]  # a dead process is not counted as ready (the metrics' gauge)
    segs, seams = _segments([26, 31], seed=3300), [8, 8]
    got = pool.build(segs, seams)
    with single_thread():
        _assert_same_entries(got, build_entries(model, segs, seams))
    assert pool.stats.failures == failures0 + 1
    assert pool.stats.rebuilt_locally == rebuilt0  # both segments came from worker 0, none from rank 0
    assert pool.stats.entries == entries0 + 2
    _wait(lambda: pool.stats.restarts == restarts0 + 1, "the worker's second restart try")
    assert len(tries) == 2 and pool.stats.restart_failures == refails0 + 1
    assert pool.alive() == [0, 1] and w.proc.pid != victim and _gone([victim])


def test_a_worker_that_cannot_load_the_model_is_an_error_at_start_up(tiny):
    settings, model, fingerprint = tiny
    before = set(mp.active_children())
    t0 = time.monotonic()
    with pytest.raises(WorkerStartError, match="no-such-model"):
        WorkerPool(
            settings.model_dump_json(),
            ["cpu"],
            model="tiny:no-such-model",
            fingerprint=fingerprint,
            layer_kinds=model.config.layer_types,
            home=torch.device("cpu"),
            local_build=_local(model),
            timeout_s=60,
        )
    assert time.monotonic() - t0 < 30  # reported, not waited out
    assert set(mp.active_children()) <= before  # the failed worker was reaped


def test_bad_scatter_devices_are_clear_errors():
    cpu = torch.device("cpu")
    assert worker_devices(3, [], cpu) == ["cpu", "cpu", "cpu"]
    with pytest.raises(DeviceError, match="not a device name"):
        worker_devices(2, ["gpu7"], cpu)
    with pytest.raises(DeviceError, match="rank 0's kind"):
        worker_devices(2, ["cuda:0", "cuda:1"], cpu)


# ---------------------------------------------------------------------- the engine on 2 workers
def test_engine_builds_cold_segments_on_the_workers_and_answers_as_one_process(tmp_path):
    """Documents of 60, 18, 44, 24 tokens with ``split_segment_tokens=32``: 6 cold pieces (60 -> 32 + 28,
    44 -> 32 + 12) spread over both workers, streamed back by layer groups of 3, the same answer as
    one process splitting alike."""
    common = {"model": TINY, "device": "cpu", "home": tmp_path, "min_cached_tokens": 4, "split_segment_tokens": 32}
    one = load_engine(Settings(**common))
    two = load_engine(Settings(**common, scatter_workers=2, scatter_stream_layers=3))
    try:
        assert one.scatter_pool is None and two.scatter_pool is not None
        pids = two.scatter_pool.pids()
        assert len(pids) == 2 and os.getpid() not in pids
        plan = Plan([Seg(s) for s in _segments([60, 18, 44, 24], seed=2100)])
        with single_thread():
            ref = one.prepare(plan, mode="hypic")
        got = two.prepare(plan, mode="hypic")
        stats = two.scatter_pool.stats
        assert stats.entries == 6 and stats.jobs == 2  # every cold piece came back from a worker, both busy
        assert stats.groups == 6 * 2 and stats.rebuilt_locally == 0  # 4 layers in groups of 3 + 1
        assert [s.hit for s in got.segments] == [False] * 4
        assert [len(s.pieces) for s in got.segments] == [2, 0, 2, 0]
        torch.testing.assert_close(got.state.last_logits, ref.state.last_logits, rtol=1e-5, atol=1e-5)
        assert got.state.length == ref.state.length
        # stored as today: the second request hits every piece and gives the same answer again
        again = two.prepare(plan, mode="hypic")
        assert [s.hit for s in again.segments] == [True] * 4
        assert again.cached_tokens == (60 + 18 + 44 + 24) - 6 * 8  # every piece's seam recomputed
        assert stats.entries == 6
        torch.testing.assert_close(again.state.last_logits, got.state.last_logits, rtol=0, atol=0)
    finally:
        two.close()
        one.close()
    assert _gone(pids)


def test_workers_build_after_the_build_context_as_one_process_does(tmp_path):
    """``build_prefix="document"`` on 2 workers: the job carries the context's tokens, the workers
    prefill every cold segment after them, and the answer is the one-process answer with the same
    context (and not the isolated build's)."""
    common = {"model": TINY, "device": "cpu", "home": tmp_path, "min_cached_tokens": 4}
    ctx = {"build_prefix": "document", "build_system_prompt": "Answer from the documents."}
    iso = load_engine(Settings(**common))
    one = load_engine(Settings(**common, **ctx))
    two = load_engine(Settings(**common, **ctx, scatter_workers=2))
    try:
        assert two.scatter_pool is not None and len(two.build_context().tokens) > 20
        plan = Plan([Seg(s) for s in _segments([40, 26, 33], seed=2300)])
        with single_thread():
            ref = one.prepare(plan, mode="hypic")
            alone = iso.prepare(plan, mode="hypic")
        got = two.prepare(plan, mode="hypic")
        assert two.scatter_pool.stats.entries == 3 and two.scatter_pool.stats.rebuilt_locally == 0
        torch.testing.assert_close(got.state.last_logits, ref.state.last_logits, rtol=1e-5, atol=1e-5)
        assert (got.state.last_logits - alone.state.last_logits).abs().max() > 1e-3  # the context counted
    finally:
        two.close()
        one.close()
        iso.close()


def test_a_worker_that_does_not_answer_in_time_is_replaced_and_its_segments_rebuilt(tiny):
    settings, model, fingerprint = tiny
    p = WorkerPool(
        settings.model_dump_json(),
        ["cpu"],
        model=None,
        fingerprint=fingerprint,
        layer_kinds=model.config.layer_types,
        home=torch.device("cpu"),
        local_build=_local(model),
        timeout_s=3,
    )
    try:
        stuck = p.workers[0].proc.pid
        os.kill(stuck, signal.SIGSTOP)  # alive, but silent
        segs, seams = _segments([30, 22], seed=2500), [8, 8]
        t0 = time.monotonic()
        got = p.build(segs, seams)
        assert 2.5 < time.monotonic() - t0 < 20  # waited for the timeout, not forever
        with single_thread():
            _assert_same_entries(got, build_entries(model, segs, seams))
        assert p.stats.failures == 1 and p.stats.rebuilt_locally == 2
        deadline = time.monotonic() + 60
        while p.stats.restarts == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert p.alive() == [0] and p.workers[0].proc.pid != stuck and _gone([stuck])
    finally:
        pids = p.pids()
        p.close()
    assert _gone(pids)


def test_through_the_http_server_the_answer_is_the_single_process_one_and_metrics_count(tmp_path):
    from fastapi.testclient import TestClient

    from hypic_agent.api import create_app

    paris = "Paris is the capital of France. It lies on the Seine and has about two million people."
    rome = "Rome is the capital of Italy. It lies on the Tiber and was founded, legend says, in 753 BC."
    body = {
        "segments": [{"kind": "document", "text": paris}, {"kind": "document", "text": rome}],
        "query": "Which river?",
        "max_tokens": 8,
        "temperature": 0,
    }
    answers, pids = [], []
    for n in (1, 2):
        settings = Settings(home=tmp_path / f"h{n}", device="cpu", model=TINY, scatter_workers=n)
        with TestClient(create_app(settings)) as client:
            r = client.post("/v1/generate", json=body)
            assert r.status_code == 200, r.text
            answers.append(r.json()["text"])
            metrics = client.get("/metrics").text
            pool = client.app.state.hypic.engine.scatter_pool  # type: ignore[attr-defined]
            if n == 1:
                assert pool is None and "hypic_scatter_entries" not in metrics
            else:
                pids = pool.pids()
                assert len(pids) == 2
                assert "hypic_scatter_workers_alive 2.0" in metrics
                assert "hypic_scatter_entries_total 2.0" in metrics  # both documents built on workers
                assert "hypic_scatter_failures_total 0.0" in metrics
    assert answers[0] == answers[1] and answers[0]
    assert _gone(pids)  # the server's shutdown stopped its workers


def test_http_cold_8_segments_then_a_killed_worker_both_answer_200(tmp_path):
    """Issue 38 item 7: ``serve --model tiny:qwen3_5_text --scatter-workers 2``: a cold request of 8
    documents answers 200 with every entry built on the workers; after kill -9 of a worker the next
    cold request answers 200 too, with the answer one process gives; the worker comes back and the
    third request is built on both again."""
    from fastapi.testclient import TestClient

    from hypic_agent.api import create_app

    topics = ["rivers", "cities", "mountains", "harbours", "bridges", "markets", "castles", "forests"]

    def body(tag: str) -> dict:
        docs = [
            {"kind": "document", "title": f"{tag} {t}", "text": f"{tag}: notes on the {t} of region {i}. " * 4}
            for i, t in enumerate(topics)
        ]
        return {"segments": docs, "query": "Which region has castles?", "max_tokens": 4, "temperature": 0}

    settings = Settings(home=tmp_path / "two", device="cpu", model=TINY, scatter_workers=2)
    with TestClient(create_app(settings)) as client:
        pool = client.app.state.hypic.engine.scatter_pool  # type: ignore[attr-defined]
        pids = pool.pids()
        assert len(pids) == 2
        cold = client.post("/v1/generate", json=body("alpha"))
        assert cold.status_code == 200, cold.text
        assert cold.json()["usage"]["cached_tokens"] == 0
        assert pool.stats.entries == 8 and pool.stats.rebuilt_locally == 0 and pool.stats.jobs == 2

        victim = pool.workers[0].proc.pid
        os.kill(victim, signal.SIGKILL)
        _wait(lambda: not pool.workers[0].proc.is_alive(), "the killed worker to exit", 20)
        after = client.post("/v1/generate", json=body("beta"))
        assert after.status_code == 200, after.text
        # all 8 built by the live worker: the dead one got no job, nothing was rebuilt on rank 0
        assert (pool.stats.failures, pool.stats.entries, pool.stats.rebuilt_locally) == (1, 16, 0), (
            f"{pool.stats}: a worker killed while idle must be reaped before the next build routes to it"
        )

        _wait(lambda: pool.alive() == [0, 1], "the killed worker's restart")
        assert pool.stats.restarts == 1 and pool.workers[0].proc.pid != victim and _gone([victim])
        jobs = pool.stats.jobs
        third = client.post("/v1/generate", json=body("gamma"))
        assert third.status_code == 200, third.text
        assert pool.stats.entries == 24 and pool.stats.jobs == jobs + 2  # both workers built again
        metrics = client.get("/metrics").text
        assert "hypic_scatter_workers_alive 2.0" in metrics and "hypic_scatter_restarts_total 1.0" in metrics
        pids = pool.pids()
    assert _gone(pids)
    # the answer after the kill is the one-process answer
    with TestClient(create_app(Settings(home=tmp_path / "one", device="cpu", model=TINY))) as one:
        ref = one.post("/v1/generate", json=body("beta"))
    assert ref.status_code == 200
    assert after.json()["text"] == ref.json()["text"]
    assert after.json()["usage"]["prompt_tokens"] == ref.json()["usage"]["prompt_tokens"]
