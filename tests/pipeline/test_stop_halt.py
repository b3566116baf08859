"""`pipeline.stop.run_in_thread` stopped by a signal: every worker process the
run started is dead when `Stopped` reaches the caller, including one started
after the first kill (Beam starting its workers when the signal came); a
process the caller had started before the run is left alone; a runner that
waits for ever for the workers it lost does not hold the stop up; a remote
run's thread is not waited for.

Each case runs in a child process (`stopped_run`), whose main thread takes
the signal as the job's does: a pytest-xdist worker runs tests off its main
thread, and its own child processes must not count as anyone's workers.
"""

import json
import os
import signal
import subprocess
import sys
import threading

from pipeline import stop
from tests.helpers import REPO, alive

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]
SIGNAL_AT_S = 0.3


def stopped_run(work: str, local: bool) -> None:
    """In the child: starts a bystander, runs ``work`` (a function of this
    module) with `run_in_thread`, sends itself SIGTERM `SIGNAL_AT_S` in, and
    prints what the stop left as JSON."""
    stop.HALT_WAIT_S = 60.0  # longer than any case's thread would wait
    bystander = subprocess.Popen(SLEEPER)
    started: list[subprocess.Popen] = []
    finished = threading.Event()
    threading.Timer(SIGNAL_AT_S, os.kill, (os.getpid(), signal.SIGTERM)).start()
    signum = None
    try:
        with stop.handling_signals():
            stop.run_in_thread(lambda: globals()[work](started, finished), local=local)
    except stop.Stopped as e:
        signum = e.signum
    print(json.dumps({
        "signum": signum, "thread_finished": finished.is_set(),
        "running": [alive(p.pid) for p in started],
        "bystander_running": bystander.poll() is None}), flush=True)
    for process in [bystander, *started]:
        process.kill()
    os._exit(0)  # the thread of a case may still wait


def workers_before_and_after_the_signal(started, finished) -> None:
    """Like Beam's runner: starts its workers (one as soon as the signal
    came, while the stop kills the first), then waits for them. The stop
    keeps killing until `stop.QUIET_S` passes without a new worker, which
    is over 10x what starting this one takes on a quiet machine."""
    started.append(subprocess.Popen(SLEEPER))
    stop.requested.wait(60)
    started.append(subprocess.Popen(SLEEPER))
    for worker in started:
        worker.wait()
    finished.set()


def a_worker_then_a_wait_of_30_s(started, finished) -> None:
    """A runner that, its worker killed, waits on (here 30 s, in Beam for ever)."""
    started.append(subprocess.Popen(SLEEPER))
    threading.Event().wait(30)
    finished.set()


def run_case(work: str, local: bool = True) -> dict:
    code = ("from tests.pipeline.test_stop_halt import stopped_run; "
            f"stopped_run({work!r}, {local!r})")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_workers_started_before_and_after_the_signal_are_dead_the_bystander_is_not():
    assert run_case("workers_before_and_after_the_signal") == {
        "signum": signal.SIGTERM, "thread_finished": True, "running": [False, False],
        "bystander_running": True}


def test_a_runner_waiting_for_its_killed_workers_does_not_hold_the_stop_up():
    assert run_case("a_worker_then_a_wait_of_30_s") == {
        "signum": signal.SIGTERM, "thread_finished": False, "running": [False],
        "bystander_running": True}


def test_a_remote_runs_thread_and_its_processes_are_left_alone():
    assert run_case("a_worker_then_a_wait_of_30_s", local=False) == {
        "signum": signal.SIGTERM, "thread_finished": False, "running": [True],
        "bystander_running": True}
