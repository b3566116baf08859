"""The outer loop both inner loops share, Orbit-style: the controller is handed its parts.

As Orbit's ``Controller``, it owns only the loop around training: train to
the next boundary (`Controller.next_stop`: a log, checkpoint, epoch or
action boundary, and the end of each ``steps_per_execution`` call while stop
signals are watched), then act there (`Controller.after_train`,
`Controller.end_epoch`): log, evaluate, save, summarize, stop if asked. Its
parts are built by `trainer.loop.build.build_controller` and handed in:

* the inner loop, which only runs steps: `trainer.loop.custom_loop.CustomLoop`
  (the controller calls it to each boundary) or `trainer.loop.keras_loop.KerasLoop`
  (``Model.fit`` owns its loop, so its callbacks hand each call's end and each
  epoch's to the same `after_train` and `end_epoch`);
* the evaluator (`trainer.loop.evaluator.Evaluator`);
* the run's checkpoints (`trainer.run.checkpoints.RunCheckpoints`: restore,
  save, history);
* the TensorBoard writers (`trainer.loop.summaries.Summaries`);
* actions (`trainer.loop.actions`, e.g. the profiler);
* the stop signals (`trainer.run.preemption.StopSignals`): after the call that
  is running it saves that step and raises `mnist_common.stop.Stopped`
  (`trainer.run.preemption.stopped_after_saving`);
* ``check_inputs``: raises if the data changed since the run started
  (`trainer.run.dataset_pin`), before each evaluation and each save;
* ``recalibrate``: called at the last step, before its evaluation and save
  (`trainer.loop.batch_norm`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable, Mapping, Optional, Protocol, Sequence

from trainer.errors import TrainerError
from trainer.loop.actions import Action
from trainer.loop.summaries import Summaries
from trainer.run.checkpoints import RunCheckpoints
from trainer.run.plan import Plan
from trainer.run.preemption import StopSignals, stopped_after_saving


class InnerLoop(Protocol):
    """What the controller drives; `KerasLoop` and `CustomLoop` both are one."""

    drives_itself: bool  # True: `fit(controller)` runs to the end, calling the controller back
    prints_progress: bool  # True: the loop prints its own progress (Keras' bar)

    def start(self, step: int) -> None:
        """Builds the training stream as it stands at ``step``."""

    def train(self, steps: int) -> Mapping:
        """Runs ``steps`` steps; returns the running epoch loss/accuracy
        (loops the controller drives)."""

    def reset(self) -> None:
        """Starts the next epoch's running loss/accuracy (loops the controller drives)."""

    def fit(self, controller: "Controller") -> None:
        """Trains from the controller's step to the end (`drives_itself` loops only)."""


@dataclasses.dataclass(frozen=True)
class Parts:
    """What the controller is handed (see the module's docstring); the run's
    boundaries come beside them, in its `trainer.run.plan.Plan`."""

    inner_loop: InnerLoop
    evaluator: Callable[[], dict]
    checkpoints: RunCheckpoints
    summaries: Summaries
    actions: Sequence[Action] = ()
    signals: Optional[StopSignals] = None
    share: Optional[Callable] = None  # `trainer.strategy.sum_over_replicas`
    check_inputs: Callable[[], None] = lambda: None  # before each evaluation and save
    recalibrate: Callable[[], None] = lambda: None  # at the last step, before its evaluation


def check_loss(step: int, logs: Mapping) -> float:
    """The running epoch loss; a `TrainerError` if it is not a number (NaN, inf):
    the weights have diverged, and saving or exporting them would pass that on."""
    loss = float(logs["loss"])
    if not math.isfinite(loss):
        raise TrainerError(f"training diverged: the loss is {loss} at step {step}; stopped "
                           "before saving it (the checkpoints are from before); lower "
                           "--learning_rate, or check the data")
    return loss


def _crossed(before: int, after: int, every: int) -> bool:
    return bool(every) and after // every > before // every


class Controller:
    """Owns the loop around the steps; the run's results."""

    def __init__(self, parts: Parts, plan: Plan):
        self.inner_loop, self.evaluator = parts.inner_loop, parts.evaluator
        self.checkpoints, self.summaries = parts.checkpoints, parts.summaries
        self.actions, self.signals, self.share = parts.actions, parts.signals, parts.share
        self.check_inputs, self.recalibrate = parts.check_inputs, parts.recalibrate
        self.plan, self.step, self.start_step, self.total_steps = plan, 0, 0, plan.total_steps
        self.result: dict = {}
        self._logged_step, self._logged_time = 0, time.perf_counter()

    def run(self) -> dict:
        """Restores, trains to the end, evaluates; the results (`finish`).

        Stop signals are watched from here until the end, also on failure.
        """
        if self.signals is not None:
            self.signals.watch()
        try:
            self.restore()
            self.summaries.start(self.step)
            self.train()
            return self.finish()
        finally:
            self.close()

    def restore(self) -> int:
        """Restores the newest checkpoint that restores; the step to start from."""
        self.step = self.start_step = self.checkpoints.restore()
        if self.start_step:
            print(f"resuming at step {self.start_step}/{self.total_steps}", flush=True)
        self._logged_step, self._logged_time = self.step, time.perf_counter()
        self._act(self.step)  # --profile_steps=1,N: from the first step
        return self.start_step

    def train(self) -> None:
        """The outer loop: the inner loop trains to each boundary, the controller acts."""
        inner = self.inner_loop
        inner.start(self.step)
        if inner.drives_itself:
            inner.fit(self)
            return
        while self.step < self.total_steps:
            step = self.next_stop(self.step)
            logs = inner.train(step - self.step)
            self.after_train(step, logs)
            if step % self.plan.steps_per_epoch == 0:
                self.end_epoch(step, logs)
                inner.reset()

    def next_stop(self, step: int) -> int:
        """The furthest step one inner-loop call may run to."""
        s = self.plan
        stops = [self.total_steps, (step // s.steps_per_epoch + 1) * s.steps_per_epoch,
                 (step // s.log_every + 1) * s.log_every]
        if self.signals is not None:  # a stop request is seen after each call
            stops.append(step + s.steps_per_execution)
        if s.checkpoint_every:
            stops.append((step // s.checkpoint_every + 1) * s.checkpoint_every)
        stops += [b for b in (a.next_boundary(step) for a in self.actions) if b is not None]
        return min(stops)

    def after_train(self, step: int, logs: Mapping) -> None:
        """After an inner-loop call (or a fit call) that trained up to ``step``;
        ``logs``: running epoch loss/accuracy."""
        before, self.step = self.step, step
        epoch_end = step % self.plan.steps_per_epoch == 0
        if _crossed(before, step, self.plan.log_every) or epoch_end:
            self._log_train(step, logs)
        if _crossed(before, step, self.plan.checkpoint_every) and not epoch_end:
            check_loss(step, logs)
            self._save()
        self._act(step)
        if not epoch_end:  # end_epoch stops after it has evaluated and saved
            self.stop_if_asked()

    def end_epoch(self, step: int, logs: Mapping) -> None:
        """(At the last step, recalibrates,) evaluates, records the epoch, checkpoints."""
        self.step = step
        if step == self.total_steps:
            self.recalibrate()
        result = self.evaluate()
        print(f"epoch {self.plan.epoch(step)}/{self.plan.epochs} "
              f"test_loss {result['test_loss']:.4f} "
              f"test_accuracy {result['test_accuracy']:.4f} "
              f"({result['test_examples']} examples)", flush=True)
        self.summaries.evaluation(step, result, self.evaluator.details)
        self.checkpoints.record_epoch(logs, result)
        self._save()
        self.stop_if_asked()

    def stop_if_asked(self) -> None:
        """On a stop signal (to this or, multi-worker, any worker): saves this
        step (unless saved) and raises `Stopped`."""
        if self.signals is None:
            return
        request = self.signals.requested(self.share)
        if request is None:
            return
        if self.checkpoints.saved_step != self.step:
            self._save()
        self.checkpoints.wait_for_peers()  # no worker leaves a peer mid-collective
        raise stopped_after_saving(*request, f"{self.step}/{self.total_steps}",
                                   self.checkpoints.path(self.step, self.checkpoints.restore_dir))

    def evaluate(self) -> dict:
        """Evaluates, checking before and after that the data is still the run's."""
        self.check_inputs()
        self.result = self.evaluator()
        self.check_inputs()
        return self.result

    def close(self) -> None:
        """Gives the stop signals back their handlers; closes the actions (a profile)."""
        if self.signals is not None:
            self.signals.release()
        for action in self.actions:
            action.close()

    def finish(self) -> dict:
        """Closes, writes the final metrics, and returns the results."""
        self.close()
        if self.step == self.start_step or not self.result:
            self.evaluate()  # nothing left to train: still report the test metrics
        self.summaries.finish(self.step, self.result)
        return {"train_steps": int(self.checkpoints.optimizer.iterations.numpy()),
                "resumed_from_step": self.start_step, **self.result,
                "history": self.checkpoints.history}

    def _log_train(self, step: int, logs: Mapping) -> None:
        loss, accuracy = check_loss(step, logs), float(logs["accuracy"])  # waits for the steps
        now = time.perf_counter()
        rate = ((step - self._logged_step) * self.plan.global_batch_size
                / max(now - self._logged_time, 1e-9))
        self._logged_step, self._logged_time = step, now
        if not self.inner_loop.prints_progress:
            print(f"step {step}/{self.total_steps} epoch {self.plan.epoch(step)}/"
                  f"{self.plan.epochs} loss {loss:.4f} accuracy {accuracy:.4f} "
                  f"{rate:.0f} examples/s", flush=True)
        self.summaries.train(step, loss, accuracy, rate)

    def _save(self) -> None:
        self.check_inputs()
        self.checkpoints.save(self.step)

    def _act(self, step: int) -> None:
        for action in self.actions:
            action(step)
