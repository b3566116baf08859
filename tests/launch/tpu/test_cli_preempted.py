"""``mnist-launch-tpu wait`` names a trainer stopped by a signal: preempted, rerun to resume."""

from __future__ import annotations

import signal

import pytest

from launch.tpu import states as ts
from mnist_common.stop import STOP_SIGNALS, Stopped
from tests.launch.helpers import RUNNING, FakeHost, status_line, wait_with


@pytest.mark.parametrize("code, name", [(143, "SIGTERM"), (130, "SIGINT")])
def test_wait_says_a_stopped_trainer_resumes_on_a_rerun(capsys, code, name):
    host = FakeHost([RUNNING, (0, status_line(f"exited status={code}"))])
    assert wait_with(host) == code
    assert (f"finished with exit status {code} (stopped by {name}: preempted or "
            "interrupted, after saving a checkpoint; rerun the train step to resume)"
            ) in capsys.readouterr().err


def test_other_statuses_get_no_note():
    assert ts.exit_note(1) == ts.exit_note(0) == ""


def test_the_launcher_knows_the_trainers_statuses():
    assert ts.STOPPED_BY_SIGNAL == {Stopped(signum).exit_status: signal.Signals(signum).name
                                    for signum in STOP_SIGNALS}
