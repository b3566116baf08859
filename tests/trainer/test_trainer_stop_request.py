"""A stop request (`trainer.run.preemption`) seen by the controller, and the
Keras loop's checkpoint cadence: fast, in-process checks of what
tests/trainer/test_trainer_preemption.py shows end to end."""

from __future__ import annotations

import logging
import os
import signal

import numpy as np
import pytest
import tensorflow as tf

from mnist_common.stop import Stopped
from trainer.config import TrainConfig
from trainer.loop import controller as controller_lib, keras_loop, summaries
from trainer.model import models as model_lib
from trainer.run import outputs, preemption, resume
from trainer.run.checkpoints import RunCheckpoints
from trainer.run.plan import Plan
from trainer.train import train_and_evaluate


class _SignalAfter:
    """An inner loop that counts steps and raises ``signum`` after ``calls`` calls."""

    drives_itself = prints_progress = False

    def __init__(self, optimizer, calls: int, signum: int):
        self.optimizer, self.left, self.signum, self.calls = optimizer, calls, signum, []

    def start(self, step: int) -> None:
        pass

    def train(self, steps: int):
        self.calls.append(steps)
        self.optimizer.iterations.assign_add(steps)
        self.left -= 1
        if self.left == 0:
            os.kill(os.getpid(), self.signum)  # handled before the next bytecode
        return {"loss": 0.5, "accuracy": 0.75}

    def reset(self) -> None:
        pass


def _checkpoints(config, model, optimizer):
    """The checkpoints of ``config``'s run at 8 steps an epoch."""
    return RunCheckpoints(config.model_dir, outputs.Role(), model, optimizer,
                          resume.saved_settings(config, 8), keep=config.keep_checkpoints)


def _controller(tmp_path, signals, signum):
    """A controller around `_SignalAfter` (signalling after its second call)."""
    config = TrainConfig(data="-", model_dir=str(tmp_path), epochs=2, log_every=6,
                         steps_per_execution=2)
    strategy = tf.distribute.get_strategy()
    model, optimizer = model_lib.build(config, strategy, total_steps=16)
    evaluator = lambda: {"test_loss": 0.25, "test_accuracy": 0.875, "test_examples": 7}
    inner = _SignalAfter(optimizer, calls=2, signum=signum)
    writers = summaries.Summaries(str(tmp_path / "logs"), config, 8,
                                  preview=lambda: np.zeros((1, 28, 28, 1), np.float32))
    return controller_lib.Controller(controller_lib.Parts(
        inner, evaluator, _checkpoints(config, model, optimizer),
        writers, signals=signals), Plan.of(config, 1, 8)), inner


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_at_the_next_call_with_a_checkpoint(tmp_path, signum, capfd):
    signals = preemption.StopSignals()
    controller, inner = _controller(tmp_path, signals, signum)
    signals.watch()
    try:
        controller.restore()
        with pytest.raises(Stopped) as stopped:
            controller.train()
    finally:
        controller.close()
    assert inner.calls == [2, 2]  # one steps_per_execution call at a time
    assert stopped.value.exit_status == 128 + signum
    path = os.path.join(str(tmp_path), "checkpoints", "ckpt-4")
    assert str(stopped.value) == (f"{signal.Signals(signum).name} received: stopped at "
                                  f"step 4/16, saved {path}; rerun the same command to resume")
    assert tf.train.latest_checkpoint(os.path.join(str(tmp_path), "checkpoints")) == path
    assert f"{signal.Signals(signum).name} received: stopping" in capfd.readouterr().err
    assert signal.getsignal(signum) is not signals._handle  # released on close


def test_a_second_signal_stops_at_once_without_saving():
    signals = preemption.StopSignals()
    signals.watch()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert signals.received == signal.SIGTERM
        with pytest.raises(Stopped, match="received twice"):
            os.kill(os.getpid(), signal.SIGTERM)
    finally:
        signals.release()


@pytest.mark.parametrize("spe, per_call, every, steps", [
    (125, 50, 10, [50, 100, 175]),  # the cpu preset's calls: 10 rounds up to 50
    (25, 4, 10, [12, 20, 33]),      # a call crossing a multiple saves at its end
    (25, 1, 10, [10, 20, 30]),      # one step per call: the exact multiples
    (25, 50, 10, []),               # an epoch is one call: epoch ends only
    (25, 4, 0, []),
])
def test_keras_checkpoint_steps(spe, per_call, every, steps):
    assert keras_loop.checkpoint_steps(spe, per_call, every) == steps


def test_keras_logs_and_writes_its_checkpoint_cadence(trainer_dataset, tmp_path, caplog):
    config = TrainConfig(data=trainer_dataset(num_train=400, num_test=40),
                         model_dir=str(tmp_path), loop="keras", epochs=2,
                         global_batch_size=16, steps_per_execution=4, checkpoint_every=10,
                         keep_checkpoints=10, verbose=0)
    with caplog.at_level(logging.INFO, logger="trainer"):
        train_and_evaluate(config)
    assert ("Keras checkpoints after the --steps_per_execution=4-step call that crosses "
            "each multiple of --checkpoint_every=10: steps 12, 20, 33, ... (the custom "
            "loop: steps 10, 20, 30, ...)") in caplog.text
    saved = sorted(int(p.name.split("-")[1].split(".")[0])
                   for p in (tmp_path / "checkpoints").glob("ckpt-*.index"))
    assert saved == [12, 20, 25, 33, 41, 50]


def test_workers_decide_from_what_every_worker_received():
    """`StopSignals.requested` with a worker exchange (`share`: sums over the
    replicas): every worker stops if any one was signalled, and says whether
    the signal was its own."""
    signals = preemption.StopSignals()
    sent = []

    def others(terms, interrupts, hangups=0):
        def share(values):
            sent.append([float(v) for v in values])
            return [values[0] + terms, values[1] + interrupts, values[2] + hangups]
        return share

    assert signals.requested(others(0, 0)) is None
    assert signals.requested(others(1, 0)) == (signal.SIGTERM, False)
    assert signals.requested(others(0, 2)) == (signal.SIGINT, False)
    assert signals.requested(others(0, 0, 1)) == (signal.SIGHUP, False)
    signals.received = signal.SIGINT
    assert signals.requested(others(1, 0)) == (signal.SIGINT, True)
    assert signals.requested() == (signal.SIGINT, True)  # one process: no exchange
    assert sent == [[0, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0], [0, 1, 0]]
