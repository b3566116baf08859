"""A signal to ``scripts/run_local.sh`` reaches the step it is running.

Each step runs as its own job, so a terminal's Ctrl-C reaches the script
alone, and a ``kill`` names the script's pid: either way the script passes
the signal on, the step stops as it does on that signal (the trainer saves a
checkpoint), and the script exits with the step's status, its claims on DATA
and MODEL_DIR released and no step left running.
"""

from __future__ import annotations

import signal

import pytest

from tests.scripts.run_local_helpers import calls, start_blocked_run


@pytest.mark.parametrize("signum, name", [
    (signal.SIGTERM, "TERM"), (signal.SIGINT, "INT"), (signal.SIGHUP, "HUP")])
def test_a_signal_to_the_script_stops_its_step_and_the_script(
        checkout, tmp_path, blocked_runs, signum, name):
    run = start_blocked_run(checkout, tmp_path, tmp_path / "model", blocked_runs)
    run.send_signal(signum)
    assert run.wait(timeout=30) == 128 + signum, run.communicate()
    assert (tmp_path / "signal").read_text().strip() == name  # the step had it
    assert [c.split()[:2] for c in calls(tmp_path)][1:] == [["-m", "pipeline"]]  # no trainer
    assert not list(tmp_path.glob("*.run_local.lock"))
