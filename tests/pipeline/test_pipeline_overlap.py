"""The background-thread helpers the job's workers use to overlap I/O."""

from __future__ import annotations

import threading

import pytest

from pipeline.shard.overlap import InOrder, prefetched


def test_prefetched_yields_in_order_and_reraises_after_earlier_items():
    def source():
        yield from range(5)
        raise OSError("disk went away")

    got = []
    with pytest.raises(OSError, match="disk went away"):
        for item in prefetched(source()):
            got.append(item)
    assert got == [0, 1, 2, 3, 4]


def test_prefetched_runs_ahead_by_at_most_depth_and_closing_stops_the_producer():
    produced, closed = [], threading.Event()

    def source():
        try:
            for i in range(1000):
                produced.append(i)
                yield i
        finally:
            closed.set()

    it = prefetched(source(), depth=2)
    assert next(it) == 0
    it.close()
    assert closed.wait(5)
    # The consumer took 1; the producer can have made at most depth + 2 more
    # (one in the queue's slots, one waiting to be put).
    assert len(produced) <= 5


def test_in_order_runs_calls_in_order_with_bounded_pending_and_surfaces_errors():
    running = threading.Semaphore(0)
    release = threading.Event()
    order = []

    def slow(i):
        running.release()
        release.wait(5)
        order.append(i)
        return i

    calls = InOrder(depth=2)
    assert calls.submit(slow, 0) == [] and calls.submit(slow, 1) == []
    assert running.acquire(timeout=5)
    release.set()
    assert calls.submit(slow, 2) == [0]  # had to wait for the oldest: depth 2
    assert calls.wait_all() == [1, 2] and order == [0, 1, 2]

    def fail():
        raise OSError(28, "No space left on device")

    calls = InOrder(depth=1)
    calls.submit(fail)
    with pytest.raises(OSError, match="No space left"):
        calls.submit(lambda: None)
    calls.close()
