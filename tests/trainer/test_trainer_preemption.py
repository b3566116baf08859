"""Preemption: SIGKILL a training process after a checkpoint, start it again.

Each case runs real ``python -m trainer`` processes with the same flags: a
run that is killed with SIGKILL as soon as its first checkpoint is on disk
(the test polls ``model_dir``), then started again with the identical command
line, and an uninterrupted reference (one per loop, shared by the cases that
compare with it: `reference`). The restarted run must

* say where it resumed ("resuming at step N/120" on stdout, and
  ``resumed_from_step`` in metrics.json), and N must be the step of the
  checkpoint found on disk after the kill: not 0, not the end;
* finish the planned 120 steps (not 120 more);
* end with the *same* weights and optimizer state as the reference, bit for
  bit: no tolerance. That holds because with ``--seed`` the initial weights
  and the input order are fixed (deterministic file interleave, seeded
  shuffles: epoch e of the stream is the same permutation in every run),
  the resumed input skips the batches the restored steps consumed, there is
  one replica, and TensorFlow's CPU kernels gave identical results run to
  run here (checked: two uninterrupted runs agree exactly). Should a
  platform's kernels not be deterministic, this test is where it shows.

``--steps_per_epoch=40`` with 400 examples and batch 16 makes a trainer
epoch (640 examples) straddle the data's epochs, so the skip has to cross a
reshuffle; ``--checkpoint_every=10`` with ``--steps_per_execution=4`` makes
the first checkpoint fall inside an epoch and, for Keras, between two
train-function calls' boundaries (it saves after the call that reaches
step 10, i.e. at step 12), so the resumed Keras run first fits the rest of
that epoch alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests import trainer_data
from tests.helpers import REPO
from tests.trainer.trainer_runs import final_variables, saved_step, state_file
from trainer.run import outputs

pytestmark = pytest.mark.slow

TOTAL_STEPS = 120


# The dataset these tests share (`trainer_dataset` in conftest).
DATASET = dict(num_train=400, num_test=40, train_shards=4, test_shards=2)


def start(dataset: str, model_dir: str, loop: str) -> subprocess.Popen:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.Popen(
        [sys.executable, "-m", "trainer", f"--data={dataset}", f"--model_dir={model_dir}",
         "--preset=smoke", f"--loop={loop}", "--epochs=3", "--steps_per_epoch=40",
         "--global_batch_size=16",
         "--steps_per_execution=4", "--checkpoint_every=10", "--seed=7", "--verbose=0",
         "--log_every=10"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-2000:] + err[-4000:]
    return out


class Reference:
    """An uninterrupted run of `start`'s command, started at once so that it
    trains alongside the first attempt it is compared with."""

    def __init__(self, dataset: str, model_dir: str, loop: str):
        self.model_dir = model_dir
        self.proc = start(dataset, model_dir, loop)

    def finished(self) -> str:
        """Its model_dir, once the run has ended well."""
        if self.proc.returncode is None:
            finish(self.proc)
        assert self.proc.returncode == 0
        return self.model_dir


@pytest.fixture(scope="module")
def reference(trainer_dataset, tmp_path_factory):
    """``reference(loop)`` → the module's one `Reference` run for that loop."""
    runs: dict[str, Reference] = {}

    def get(loop: str) -> Reference:
        if loop not in runs:
            runs[loop] = Reference(trainer_dataset(**DATASET),
                                   str(tmp_path_factory.mktemp(f"reference-{loop}")), loop)
        return runs[loop]
    yield get
    for run in runs.values():
        run.proc.kill()
        run.proc.communicate()


@pytest.mark.parametrize("loop", ["keras", "custom"])
def test_sigkill_then_restart_resumes_and_matches_an_uninterrupted_run(
        trainer_dataset, reference, tmp_path, loop):
    dataset = trainer_dataset(**DATASET)
    model_dir = str(tmp_path / "preempted")
    uninterrupted = reference(loop)
    first = start(dataset, model_dir, loop)
    try:
        while not os.path.exists(state_file(model_dir)) and first.poll() is None:
            time.sleep(0.005)
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=60)
    finally:
        first.kill()
    # The kill landed mid-run: no clean exit, no final metrics.
    assert first.returncode == -signal.SIGKILL, "training ended before the kill"
    assert not os.path.exists(os.path.join(model_dir, outputs.METRICS))
    step = saved_step(model_dir)
    assert 0 < step < TOTAL_STEPS

    out = finish(start(dataset, model_dir, loop))  # the same command again
    assert f"resuming at step {step}/{TOTAL_STEPS}" in out
    metrics = trainer_data.read_metrics(model_dir)
    assert metrics["resumed_from_step"] == step
    assert metrics["train_steps"] == TOTAL_STEPS
    assert metrics["test_examples"] == 40
    assert sorted(os.listdir(model_dir)) == ["checkpoints", "dataset.json", "export", "logs",
                                          "metrics.json"]

    reference_dir = uninterrupted.finished()
    expected = trainer_data.read_metrics(reference_dir)
    assert expected["resumed_from_step"] == 0 and expected["train_steps"] == TOTAL_STEPS
    want, got = final_variables(reference_dir), final_variables(model_dir)
    assert sorted(got) == sorted(want) and len(want) > 10
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert metrics["test_loss"] == expected["test_loss"]
    assert metrics["test_accuracy"] == expected["test_accuracy"]
    # The whole history survives the kill; epochs evaluated on equal weights agree.
    for key in ("test_loss", "test_accuracy"):
        assert metrics["history"][key] == expected["history"][key]
    assert len(metrics["history"]["train_loss"]) == 3


def stop_with(proc: subprocess.Popen, model_dir: str, signum: int) -> tuple[str, str]:
    """Sends ``signum`` once the first checkpoint is on disk; the run's output."""
    while not os.path.exists(state_file(model_dir)) and proc.poll() is None:
        time.sleep(0.005)
    proc.send_signal(signum)
    try:
        return proc.communicate(timeout=120)
    finally:
        proc.kill()


@pytest.mark.parametrize("loop", ["keras", "custom"])
def test_sigterm_saves_at_the_next_call_and_the_rerun_matches_an_uninterrupted_run(
        trainer_dataset, reference, tmp_path, loop):
    dataset = trainer_dataset(**DATASET)
    model_dir = str(tmp_path / "preempted")
    uninterrupted = reference(loop)
    first = start(dataset, model_dir, loop)
    out, err = stop_with(first, model_dir, signal.SIGTERM)
    assert first.returncode == 143, out[-2000:] + err[-4000:]
    assert "Traceback" not in err, err[-4000:]
    step = saved_step(model_dir)
    assert 0 < step < TOTAL_STEPS
    ckpt = os.path.join(model_dir, outputs.CHECKPOINTS, f"ckpt-{step}")
    assert err.strip().splitlines()[-1] == (
        f"SIGTERM received: stopped at step {step}/{TOTAL_STEPS}, saved {ckpt}; "
        "rerun the same command to resume")
    assert not os.path.exists(os.path.join(model_dir, outputs.METRICS))
    if loop == "keras":  # the stop comes at the end of a 4-step call
        assert step % 4 == 0

    out = finish(start(dataset, model_dir, loop))
    assert f"resuming at step {step}/{TOTAL_STEPS}" in out
    metrics = trainer_data.read_metrics(model_dir)
    assert metrics["resumed_from_step"] == step and metrics["train_steps"] == TOTAL_STEPS
    reference_dir = uninterrupted.finished()
    want, got = final_variables(reference_dir), final_variables(model_dir)
    assert sorted(got) == sorted(want) and len(want) > 10
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    expected = trainer_data.read_metrics(reference_dir)
    assert metrics["history"]["test_loss"] == expected["history"]["test_loss"]


def test_sigint_is_one_line_and_the_same_clean_stop(trainer_dataset, tmp_path):
    dataset = trainer_dataset(**DATASET)
    model_dir = str(tmp_path / "interrupted")
    proc = start(dataset, model_dir, "custom")
    out, err = stop_with(proc, model_dir, signal.SIGINT)
    assert proc.returncode == 130, out[-2000:] + err[-4000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-4000:]
    step = saved_step(model_dir)
    assert 0 < step < TOTAL_STEPS
    assert err.strip().splitlines()[-1].startswith(
        f"SIGINT received: stopped at step {step}/{TOTAL_STEPS}, saved ")
    assert f"resuming at step {step}/{TOTAL_STEPS}" in finish(start(dataset, model_dir,
                                                                    "custom"))
