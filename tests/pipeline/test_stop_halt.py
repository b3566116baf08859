"""`pipeline.stop._halt`: every worker process of the stopped run is dead when
it returns, including one the run's thread started after the first kill (Beam
starting its workers when the signal came)."""

import subprocess
import sys
import threading
import time

import pytest

from pipeline import stop

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


@pytest.fixture
def halt_wait(monkeypatch):
    monkeypatch.setattr(stop, "HALT_WAIT_S", 10.0)  # a broken _halt fails in 10 s, not 20
    yield
    stop.requested.clear()


def run_thread_starting_workers(delays: list[float]) -> tuple[threading.Thread, list]:
    """A thread that starts a sleeping worker after each delay, then waits for all of
    them, as Beam's runner waits for its worker processes."""
    workers: list[subprocess.Popen] = []

    def run() -> None:
        for delay in delays:
            time.sleep(delay)
            workers.append(subprocess.Popen(SLEEPER))
        for worker in workers:
            worker.wait()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, workers


def test_workers_started_before_and_after_the_stop_are_dead_when_it_returns(halt_wait):
    thread, workers = run_thread_starting_workers([0.0, 0.5])
    while not workers:
        time.sleep(0.01)
    stop._halt(thread)  # the second worker starts while it runs
    assert not thread.is_alive()
    assert len(workers) == 2
    assert [w.poll() for w in workers] == [-9, -9]
    assert not [w.pid for w in workers if stop._running(w.pid)]


def test_a_run_without_worker_processes_is_waited_for(halt_wait):
    done = threading.Event()
    thread = threading.Thread(target=lambda: (time.sleep(0.3), done.set()), daemon=True)
    thread.start()
    stop._halt(thread)
    assert done.is_set() and not thread.is_alive()
