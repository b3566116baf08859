"""The line a stop on a signal prints says how to resume: rerun the same
command, or the command ``TRAINER_RESUME_COMMAND`` names.

A wrapper that starts over when rerun (``scripts/run_local.sh`` without
``RESUME=1``) sets it, so the advice its user reads is right for the command
they ran. The value is checked as a flag is: empty or more than one line is
refused in one line, exit 2. Small processes, no training: the line is built
where the trainer builds it (`trainer.run.preemption`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import REPO

RESUME = "RESUME=1 EPOCHS=5 bash scripts/run_local.sh --seed=1"

# The trainer's command line whose training stops on SIGTERM after step 3.
_STOPPED_IN_TRAINING = """
    import sys
    import trainer.train
    from trainer.run.preemption import stopped_after_saving

    def train_and_evaluate(config):
        raise stopped_after_saving(15, True, "3/8", "M/checkpoints/ckpt-3")

    trainer.train.train_and_evaluate = train_and_evaluate
    from trainer.__main__ import main
    sys.exit(main(["--data=gs://b/mnist", "--model_dir=gs://b/run", "--preset=smoke"]))
    """
# A signal before training: the command line's handler ends the process.
_OUTSIDE_TRAINING = """
    import os, sys
    import trainer.__main__

    def parse_flags(argv, **kwargs):  # a Ctrl-C while the flags are read
        os.kill(os.getpid(), 2)
    trainer.__main__.parse_flags = parse_flags
    sys.exit(trainer.__main__.main(["--data=-", "--model_dir=-"]))
    """


def python(code: str, **env) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "TRAINER_RESUME_COMMAND"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO,
                          capture_output=True, text=True, timeout=120,
                          env={**environ, **env})


def test_a_stop_names_the_command_that_resumes():
    result = python(_STOPPED_IN_TRAINING, TRAINER_RESUME_COMMAND=RESUME)
    assert result.returncode == 128 + signal.SIGTERM, result.stderr
    assert result.stderr.splitlines()[-1] == (
        "SIGTERM received: stopped at step 3/8, saved M/checkpoints/ckpt-3; "
        f"to resume, run: {RESUME}")


def test_without_it_the_same_command_resumes():
    result = python(_STOPPED_IN_TRAINING)
    assert result.stderr.splitlines()[-1] == (
        "SIGTERM received: stopped at step 3/8, saved M/checkpoints/ckpt-3; "
        "rerun the same command to resume")


def test_a_signal_outside_training_names_it_too():
    result = python(_OUTSIDE_TRAINING, TRAINER_RESUME_COMMAND=RESUME)
    assert result.returncode == 128 + signal.SIGINT, result.stderr
    assert result.stderr.splitlines() == [
        "SIGINT received outside the training steps: stopped; to resume from the last "
        f"checkpoint, if any, run: {RESUME}"]


@pytest.mark.parametrize("value", ["", "  ", "RESUME=1 bash x\nrm -rf y"])
def test_an_empty_or_multiline_command_is_refused(value):
    result = python("import sys\nfrom trainer.__main__ import main\n"
                    "sys.exit(main(['--data=-', '--model_dir=-']))",
                    TRAINER_RESUME_COMMAND=value)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"error: TRAINER_RESUME_COMMAND={value!r}: expected the command that resumes "
        "this run, on one line"]
