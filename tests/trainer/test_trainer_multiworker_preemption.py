"""SIGTERM to one of two MultiWorkerMirroredStrategy workers (`trainer.run.preemption`).

A preempted VM or pod gets the signal alone; its peers train on inside the
same collectives. Each case starts an uninterrupted two-worker reference
and, beside it, a two-worker run whose worker ``signalled`` gets SIGTERM as
soon as the chief's first checkpoint is on disk. Then:

* both workers stop at the same step, exit 143 with one line each (the
  signalled one "SIGTERM received", the other "SIGTERM received by another
  worker"), and the chief's ``model_dir`` holds the checkpoint of that step;
* the same two commands again resume there on both workers, finish the
  planned steps, and end with the reference's weights and optimizer state,
  bit for bit (the single-worker reasoning of tests/trainer/test_trainer_preemption.py,
  plus collectives that sum in the same order every run);
* (custom loop) a non-chief that cannot see the chief's checkpoints (another
  ``--model_dir``) is refused on both workers instead of training from step 0
  beside a chief at step N.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from tests import trainer_data
from tests.trainer import trainer_runs
from tests.trainer.trainer_runs import final_variables, saved_step, state_file

pytestmark = pytest.mark.slow

DATASET = dict(num_train=256, num_test=37, train_shards=4, test_shards=1)
TOTAL_STEPS = 5 * 40


def _argv(dataset: str, loop: str, model_dir_for):
    return lambda i: [
        "-m", "trainer", f"--data={dataset}", f"--model_dir={model_dir_for(i)}",
        "--preset=smoke", "--strategy=multi_worker", f"--loop={loop}", "--epochs=5",
        "--steps_per_epoch=40", "--global_batch_size=16", "--steps_per_execution=4",
        "--checkpoint_every=8", "--seed=7", "--verbose=0", "--log_every=1000"]


def _ok(results) -> list[str]:
    for rc, out, err, _ in results:
        assert rc == 0, out[-2000:] + err[-4000:]
    return [out for _, out, _, _ in results]


def _sigterm_after_first_checkpoint(procs, model_dir: str, signalled: int) -> None:
    while not os.path.exists(state_file(model_dir)) and procs[signalled].poll() is None:
        time.sleep(0.005)
    procs[signalled].send_signal(signal.SIGTERM)


@pytest.mark.parametrize("loop,signalled", [("keras", 1), ("custom", 0)])
def test_sigterm_to_one_worker_stops_both_at_one_step_and_the_rerun_matches(
        trainer_dataset, tmp_path, loop, signalled):
    dataset = trainer_dataset(**DATASET)
    reference_dir, model_dir = str(tmp_path / "reference"), str(tmp_path / "preempted")
    reference = trainer_runs.start_workers(_argv(dataset, loop, lambda i: reference_dir))
    first = trainer_runs.start_workers(_argv(dataset, loop, lambda i: model_dir))
    _sigterm_after_first_checkpoint(first, model_dir, signalled)
    results = trainer_runs.finish_workers(first)
    step = saved_step(model_dir)
    assert 0 < step < TOTAL_STEPS
    saved = f"{model_dir}/checkpoints/ckpt-{step}"
    for index, (rc, out, err, _) in enumerate(results):
        assert rc == 128 + signal.SIGTERM, out[-2000:] + err[-4000:]
        who = "" if index == signalled else " by another worker"
        assert (f"SIGTERM received{who}: stopped at step {step}/{TOTAL_STEPS}, saved "
                f"{saved}; rerun the same command to resume") in err.splitlines()
        assert "Traceback" not in err, err[-4000:]
    assert not os.path.exists(os.path.join(model_dir, "metrics.json"))

    if loop == "custom":  # a non-chief that does not see the chief's checkpoints
        elsewhere = str(tmp_path / "elsewhere")
        refused = trainer_runs.finish_workers(trainer_runs.start_workers(
            _argv(dataset, loop, lambda i: model_dir if i == 0 else elsewhere)))
        for (rc, _, err, _), own, start in zip(refused, (model_dir, elsewhere), (step, 0)):
            assert rc == 1, err[-4000:]
            assert trainer_runs.errors(err) == [
                f"error: {own}/checkpoints: the workers would resume at different steps "
                f"(this one at {start}); every worker must read the chief's --model_dir "
                "(shared storage, such as gs://)"]
        assert saved_step(model_dir) == step  # nothing trained, nothing saved

    outs = _ok(trainer_runs.finish_workers(
        trainer_runs.start_workers(_argv(dataset, loop, lambda i: model_dir))))
    assert all(f"resuming at step {step}/{TOTAL_STEPS}" in out for out in outs)
    assert outs[0].strip().splitlines()[-1] == outs[1].strip().splitlines()[-1]
    metrics = trainer_data.read_metrics(model_dir)
    assert metrics["resumed_from_step"] == step and metrics["train_steps"] == TOTAL_STEPS
    assert not [n for n in os.listdir(model_dir) if n.startswith("workertemp")]

    _ok(trainer_runs.finish_workers(reference))
    expected, got = final_variables(reference_dir), final_variables(model_dir)
    assert expected.keys() == got.keys()
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    expected = trainer_data.read_metrics(reference_dir)
    assert (metrics["test_loss"], metrics["test_accuracy"]) == (
        expected["test_loss"], expected["test_accuracy"])
    # Evaluations on equal weights agree; the stopped epoch's running train
    # loss covers only the steps after the resume, later epochs agree.
    history, want = metrics["history"], expected["history"]
    assert history["test_loss"] == want["test_loss"]
    assert history["train_loss"][1:] == want["train_loss"][1:]
