"""Single flight (threads and asyncio) and thread safety of the store."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest

from hypic_agent.segments.store.singleflight import SingleFlight

from .helpers import entry_bytes, key, make_store, meta, payload, same

N = 8


def test_n_threads_one_compute(tmp_path):
    s = make_store(tmp_path)
    calls = []
    barrier = threading.Barrier(N)
    results = [None] * N

    def compute():
        calls.append(1)
        time.sleep(0.2)  # long enough for every other thread to arrive and wait
        return payload(3), meta(3, prefill_ms=200.0)

    def worker(i):
        barrier.wait()
        results[i] = s.get_or_compute(key(3), compute)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(N)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert sum(r.computed and not r.waited for r in results) == 1
    assert all(same(r.tensors, payload(3)) for r in results)
    assert sum(r.waited for r in results) + sum(r.tier is not None for r in results) == N - 1
    assert s.stats().in_flight == 0
    again = s.get_or_compute(key(3), compute)
    assert not again.computed and again.tier == "cpu" and len(calls) == 1


def test_failure_reaches_every_waiter_then_retries(tmp_path):
    s = make_store(tmp_path)
    barrier = threading.Barrier(4)
    errors = []
    attempts = []

    def failing():
        attempts.append(1)
        time.sleep(0.2)
        raise RuntimeError("prefill crashed")

    def worker():
        barrier.wait()
        try:
            s.get_or_compute(key(1), failing)
        except RuntimeError as exc:
            errors.append(str(exc))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == ["prefill crashed"] * 4 and len(attempts) == 1
    ok = s.get_or_compute(key(1), lambda: (payload(1), meta(1)))
    assert ok.computed and s.get(key(1)) is not None


def test_async_callers_share_one_compute(tmp_path):
    s = make_store(tmp_path)
    calls = []

    async def compute():
        calls.append(1)
        await asyncio.sleep(0.2)
        return payload(5), meta(5)

    async def main():
        return await asyncio.gather(*(s.aget_or_compute(key(5), compute) for _ in range(N)))

    results = asyncio.run(main())
    assert len(calls) == 1 and sum(r.waited for r in results) == N - 1
    assert all(same(r.tensors, payload(5)) for r in results)

    def sync_compute():  # sync compute runs in a worker thread, not on the loop
        calls.append(1)
        return payload(6), meta(6)

    r = asyncio.run(s.aget_or_compute(key(6), sync_compute))
    assert r.computed and len(calls) == 2
    r = asyncio.run(s.aget_or_compute(key(6), sync_compute))
    assert r.tier == "cpu" and len(calls) == 2


def test_singleflight_primitive():
    sf: SingleFlight[int] = SingleFlight()
    assert sf.do("a", lambda: 1) == (1, True)
    fut, leader = sf.join("b")
    fut2, leader2 = sf.join("b")
    assert leader and not leader2 and fut is fut2 and sf.in_flight() == 1
    sf.land("b", fut, result=7)
    assert fut2.result() == 7 and sf.in_flight() == 0
    with pytest.raises(ValueError):
        sf.do("c", lambda: (_ for _ in ()).throw(ValueError("x")))
    assert sf.in_flight() == 0


def test_concurrent_mixed_operations_stay_consistent(tmp_path):
    e = entry_bytes()
    s = make_store(tmp_path, gpu_device="cpu", gpu_budget_bytes=3 * e, cpu_budget_bytes=4 * e, disk_budget_bytes=8000)
    errors = []

    def worker(seed):
        rng = random.Random(seed)
        try:
            for _ in range(40):
                i = rng.randrange(12)
                op = rng.random()
                if op < 0.5:
                    got = s.get_or_compute(key(i), lambda i=i: (payload(i), meta(i, prefill_ms=float(i))))
                    assert same(got.tensors, payload(i))
                elif op < 0.8:
                    s.put(key(i), payload(i), meta(i))
                elif op < 0.9:
                    s.delete(key(i))
                else:
                    s.set_policy(key(i), pinned=rng.random() < 0.2)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(repr(exc))

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    s.flush()
    idx = s._index
    rows = {r.key: r for r in s.registry.records()}
    assert set(rows) == set(idx)
    files = {p.relative_to(tmp_path / "store").as_posix() for p in (tmp_path / "store").rglob("*.safetensors")}
    assert files == {e.location for e in idx.values() if e.location}
    assert not list((tmp_path / "store").rglob("*.tmp"))
    for k, entry in idx.items():
        assert rows[k].tier == entry.tier and rows[k].location == entry.location
    for name, t in (("gpu", s.gpu), ("cpu", s.cpu)):
        assert t.used == sum(idx[k].nbytes for k in t.held_keys()), name
