"""The child process of tests/pipeline/test_stop_halt.py: `stopped_run` runs one
case (a function of this module standing in for Beam's runner) under
`pipeline.stop.run_in_thread`, signals itself and prints what the stop left."""

import json
import os
import signal
import subprocess
import sys
import threading

from mnist_common.stop import Stopped
from pipeline import stop
from tests.helpers import alive

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
    except Stopped as e:
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
