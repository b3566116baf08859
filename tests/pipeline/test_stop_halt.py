"""`pipeline.stop.run_in_thread` stopped by a signal: every worker process the
run started is dead when `Stopped` reaches the caller, including one started
after the first kill (Beam starting its workers when the signal came); a
process the caller had started before the run is left alone; a runner that
waits for ever for the workers it lost does not hold the stop up; a remote
run's thread is not waited for.

Each case runs in a child process (`tests.pipeline.stop_cases.stopped_run`),
whose main thread takes the signal as the job's does: a pytest-xdist worker
runs tests off its main thread, and its own child processes must not count as
anyone's workers.
"""

import json
import signal
import subprocess
import sys

from tests.helpers import REPO


def run_case(work: str, local: bool = True) -> dict:
    code = ("from tests.pipeline.stop_cases import stopped_run; "
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
