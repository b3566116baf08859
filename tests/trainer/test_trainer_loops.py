"""The loops: the custom loop's step (compiled with XLA), and the controller's
outer loop driving an inner loop from boundary to boundary."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
import tensorflow as tf

from tests import trainer_data
from trainer.config import TrainConfig
from trainer.data import input_pipeline, splits
from trainer.loop import controller as controller_lib, custom_loop, eval_metrics, summaries
from trainer.model import models as model_lib
from trainer.run import outputs, resume
from trainer.run.checkpoints import RunCheckpoints
from trainer.run.plan import Plan


@pytest.mark.tf221  # the TPU build of TensorFlow has no XLA CPU backend
def test_train_step_compiles_with_xla_on_cpu():
    """jit_compile=True: the TPU-safety check that runs without a TPU."""
    out = f"ram://xla-{uuid.uuid4().hex}"
    trainer_data.write_dataset(out, num_train=64, num_test=8)
    files = splits.split_files(out, splits.load_manifest(out), "train")
    ds = input_pipeline.train_dataset(files, 16, tf.distribute.InputContext())
    strategy = tf.distribute.get_strategy()
    config = TrainConfig(data=out, model_dir="-", global_batch_size=16,
                         steps_per_execution=3, jit_compile=True)
    loop = custom_loop.CustomLoop(config, strategy, *model_lib.build(config, strategy, 6),
                                  lambda step: strategy.experimental_distribute_dataset(ds))
    batch = next(iter(ds))
    hlo = loop.replica_step.experimental_get_compiler_ir(batch)(stage="hlo")
    assert hlo.startswith("HloModule")
    loop.start(0)
    logs = loop.train(6)  # twice the multi-step function, XLA step inside
    assert int(loop.optimizer.iterations.numpy()) == 6
    assert np.isfinite(loop.train_loss.result().numpy())
    assert float(logs["loss"]) == float(loop.train_loss.result())


def _checkpoints(config, model, optimizer):
    """The checkpoints of ``config``'s run at 8 steps an epoch."""
    return RunCheckpoints(config.model_dir, outputs.Role(), model, optimizer,
                          resume.saved_settings(config, 8), keep=config.keep_checkpoints)


class _RecordingLoop:
    """An inner loop that only counts: the steps of each call, and each reset."""

    drives_itself = prints_progress = False

    def __init__(self, optimizer):
        self.optimizer, self.calls = optimizer, []

    def start(self, step: int) -> None:
        pass

    def train(self, steps: int):
        self.calls.append(steps)
        self.optimizer.iterations.assign_add(steps)
        return {"loss": 0.5, "accuracy": 0.75}

    def reset(self) -> None:
        self.calls.append("reset")


def test_controller_runs_the_inner_loop_from_boundary_to_boundary(tmp_path, capsys):
    """Stops at every log (3), checkpoint (5) and epoch (8) boundary; logs,
    checkpoints and evaluates there; resets the inner loop's metrics per epoch;
    recalibrates once, at the last step, before its evaluation."""
    config = TrainConfig(data="-", model_dir=str(tmp_path), epochs=2, log_every=3,
                         checkpoint_every=5, keep_checkpoints=10)
    strategy = tf.distribute.get_strategy()
    model, optimizer = model_lib.build(config, strategy, total_steps=16)
    evaluations = []

    class Evaluator:
        # Seven test digits, all right: a confusion matrix and no misclassified.
        details = eval_metrics.EvalDetails(
            confusion=np.diag([7] + [0] * 9), images=np.zeros((0, 28, 28, 1), np.float32),
            predicted=np.zeros(0, np.int64), labels=np.zeros(0, np.int64),
            indices=np.zeros(0, np.int64))

        def __call__(self):
            evaluations.append(int(optimizer.iterations.numpy()))
            return {"test_loss": 0.25, "test_accuracy": 0.875, "test_examples": 7}

    inner = _RecordingLoop(optimizer)
    writers = summaries.Summaries(str(tmp_path / "logs"), config, 8,
                                  preview=lambda: np.zeros((1, 28, 28, 1), np.float32))
    controller = controller_lib.Controller(controller_lib.Parts(
        inner, Evaluator(), _checkpoints(config, model, optimizer),
        writers, recalibrate=lambda: evaluations.append(("recalibrate",
                                                         int(optimizer.iterations.numpy())))),
        Plan.of(config, 1, 8))
    controller.restore()
    controller.train()
    result = controller.finish()
    controller.close()
    assert inner.calls == [3, 2, 1, 2, "reset", 1, 1, 2, 3, 1, "reset"]
    assert evaluations == [8, ("recalibrate", 16), 16]
    printed = [line.split()[1] for line in capsys.readouterr().out.splitlines()
               if line.startswith("step ")]
    assert printed == ["3/16", "6/16", "8/16", "9/16", "12/16", "15/16", "16/16"]
    assert sorted(int(p.name.split("-")[1].split(".")[0])
                  for p in (tmp_path / "checkpoints").glob("ckpt-*.index")) == [5, 8, 10, 15, 16]
    assert result["train_steps"] == 16
    assert result["history"]["train_loss"] == [0.5, 0.5]
    assert result["history"]["test_accuracy"] == [0.875, 0.875]
