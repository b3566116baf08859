"""The skeleton both loops share, Orbit-style: one outer controller, two inner loops.

As in Orbit, the controller owns the loop around training and the inner
loop only runs steps. Everything around the steps is here and is the same
for both loops: the controller restores the newest checkpoint that restores
(`trainer.run.checkpoints`; its settings checked by `trainer.run.resume`), and decides
when to log (TensorBoard ``logs/train``: ``loss``, ``accuracy``,
``examples_per_second`` every ``log_every`` steps and at epoch ends;
``logs/validation``: ``loss``, ``accuracy`` per epoch; and the images and
settings of `trainer.loop.summaries`: the input digits and the config at start,
the confusion matrix and misclassified digits per epoch, the final test
metrics at the end), checkpoint
(``checkpoints/ckpt-<step>`` through ``tf.train.CheckpointManager``, at
epoch ends and every ``checkpoint_every`` steps), evaluate (epoch ends,
with a `trainer.loop.evaluator.Evaluator`) and profile (``--profile_steps``),
and stops on a SIGTERM or SIGINT (`trainer.run.preemption`): after the call that
is running it saves that step and raises `trainer.run.preemption.Stopped`.
The history of every epoch and the run's settings travel inside the
checkpoint, so ``metrics.json`` after a resume holds the whole run. Before
each evaluation and each checkpoint it checks that the data is still the
run's (the ``check_inputs`` it is given, `trainer.run.dataset_pin`).

* Custom loop: `Controller.train` is the outer loop. It picks the next stop
  (`Controller.next_stop`: the next log, checkpoint, profiler or epoch
  boundary), has the inner loop (`trainer.loop.custom_loop.CustomLoop`, an
  `InnerLoop`) run that many steps, then acts on the boundary it reached
  (`Controller.after_train`, `Controller.end_epoch`).
* Keras loop: ``Model.fit`` owns its loop and decides its own call
  boundaries, so `trainer.loop.keras_loop` hands fit's boundaries to the same
  `after_train` and `end_epoch`, which reach the same decisions at the end
  of the call that crosses a boundary.
"""

from __future__ import annotations

import json
import logging
import signal
import time
from typing import Callable, Mapping, Protocol

import numpy as np

import trainer  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TF loads)
import tensorflow as tf
import tf_keras as keras

from mnist_contract import join_path
from trainer import strategy as strategy_lib
from trainer.config import TrainConfig
from trainer.errors import TrainerError, os_reason
from trainer.loop import summaries
from trainer.loop.evaluator import Evaluator
from trainer.run import checkpoints, outputs, resume
from trainer.run.preemption import StopSignals, Stopped

log = logging.getLogger(__name__)

STATE_NAME = "trainer_state"  # the checkpoint's JSON: model name and history
_STATE_KEY = f"{STATE_NAME}/.ATTRIBUTES/VARIABLE_VALUE"
HISTORY_KEYS = ("train_loss", "train_accuracy", "test_loss", "test_accuracy")


class InnerLoop(Protocol):
    """What `Controller.train` drives (Orbit's ``StandardTrainer`` shape)."""

    def train(self, iterator, steps: int) -> Mapping:
        """Runs ``steps`` training steps; returns the running epoch loss/accuracy."""

    def reset(self) -> None:
        """Starts the next epoch's running loss/accuracy."""


def _crossed(before: int, after: int, every: int) -> bool:
    return bool(every) and after // every > before // every


class Controller:
    """When to log, checkpoint, evaluate and profile; the run's history and results."""

    def __init__(self, config: TrainConfig, strategy: tf.distribute.Strategy,
                 model: keras.Model, optimizer, steps_per_epoch: int,
                 evaluator: Evaluator, *, print_steps: bool,
                 check_inputs: Callable[[], None] = lambda: None,
                 signals: StopSignals | None = None):
        self.config, self.strategy, self.evaluator = config, strategy, evaluator
        # Raises if the data changed since the run started (`trainer.run.dataset_pin`).
        self.check_inputs = check_inputs
        self.signals = signals
        self.steps_per_epoch = steps_per_epoch
        self.total_steps = config.epochs * steps_per_epoch
        self.print_steps = print_steps
        self.optimizer = optimizer
        self.model, self.state = model, tf.Variable("", dtype=tf.string, trainable=False,
                                                    name=STATE_NAME)
        self.checkpoint = self._new_checkpoint()
        self.manager = self._new_manager()  # this worker's (a scratch folder off the chief)
        # The chief's, which every worker restores from.
        self.restore_dir = join_path(config.model_dir, outputs.CHECKPOINTS)
        logs = outputs.write_dir(config.model_dir, outputs.LOGS, strategy)
        self.logs_dir = logs
        try:
            self.train_writer = tf.summary.create_file_writer(join_path(logs, "train"))
            self.eval_writer = tf.summary.create_file_writer(join_path(logs, "validation"))
            # The run's root: its HParams record and final test metrics.
            self.run_writer = tf.summary.create_file_writer(logs)
        except tf.errors.OpError as e:
            raise TrainerError(f"{logs}: cannot write the TensorBoard logs of --model_dir "
                               f"({os_reason(e)})") from None
        self.history: dict[str, list[float]] = {k: [] for k in HISTORY_KEYS}
        self.step = self.start_step = 0
        self._saved_step: int | None = None
        # Multi-worker: how the workers agree on the step they start from and
        # on stopping (`trainer.strategy.sum_over_replicas`); None elsewhere.
        self._share = strategy_lib.sum_over_replicas(strategy)
        self.result: dict = {}
        self._logged_step, self._logged_time = 0, time.perf_counter()
        self._profiling = False

    # -- start ---------------------------------------------------------------
    def _new_checkpoint(self) -> tf.train.Checkpoint:
        return tf.train.Checkpoint(model=self.model, optimizer=self.optimizer,
                                   **{STATE_NAME: self.state})

    def _new_manager(self) -> tf.train.CheckpointManager:
        directory = outputs.write_dir(self.config.model_dir, outputs.CHECKPOINTS,
                                      self.strategy)
        return tf.train.CheckpointManager(
            self.checkpoint, directory, max_to_keep=self.config.keep_checkpoints,
            step_counter=self.optimizer.iterations)

    def restore(self) -> int:
        """Restores the newest checkpoint that restores (`trainer.run.checkpoints`);
        returns the step to start from.

        Every worker restores from the chief's ``model_dir/checkpoints`` (the
        others save to scratch folders), so under multi-worker training
        ``model_dir`` must be storage all workers read, such as gs://; the
        workers then check they start from the same step. Only the chief
        repairs the state file; with ``--restart`` (the chief has deleted the
        checkpoints) the others restore nothing.
        """
        chief = strategy_lib.is_chief(self.strategy)
        checkpoints.clean_temp(self.manager.directory)
        latest = ""
        if chief or not self.config.restart:
            latest, damaged = checkpoints.restore_newest(self.restore_dir, self._restore)
        if latest:
            if chief:
                checkpoints.repair_state(self.restore_dir, latest, damaged)
            # For the restored checkpoint object; on the chief it reads the
            # repaired state file.
            self.manager = self._new_manager()
            log.info("restored %s", latest)
        self.step = self.start_step = int(self.optimizer.iterations.numpy())
        self._saved_step = self.start_step if latest else None
        self._check_same_start()
        if self.start_step:
            print(f"resuming at step {self.start_step}/{self.total_steps}", flush=True)
        self._logged_step, self._logged_time = self.step, time.perf_counter()
        self._profile(self.step)  # --profile_steps=1,N: from the first step
        return self.start_step

    def _check_same_start(self) -> None:
        """Multi-worker: raises on every worker unless all start at one step
        (steps s_i of n replicas are all equal iff n * sum(s_i^2) == sum(s_i)^2)."""
        if self._share is None:
            return
        total, squares = self._share([self.start_step, self.start_step ** 2])
        if self.strategy.num_replicas_in_sync * squares != total ** 2:
            raise TrainerError(
                f"{self.restore_dir}: the workers would resume at different steps (this one "
                f"at {self.start_step}); every worker must read the chief's "
                "--model_dir (shared storage, such as gs://)")

    def _restore(self, prefix: str) -> None:
        """Restores ``prefix`` after checking its settings; raises if it is damaged."""
        saved = _saved_state(prefix)
        resume.check_settings(saved, self.config, self.steps_per_epoch,
                              int(prefix.rsplit("-", 1)[1]), prefix.rsplit("/", 1)[0])
        self.checkpoint = self._new_checkpoint()
        self.checkpoint.restore(prefix).assert_existing_objects_matched()
        self.history = {k: list(saved.get("history", {}).get(k, [])) for k in HISTORY_KEYS}

    def log_start(self, inputs: np.ndarray) -> None:
        """The run's settings (HParams) and a batch of its input digits
        (`trainer.loop.summaries.train_preview`), at the step training starts from."""
        with self.run_writer.as_default(step=self.step):
            summaries.write_hparams(summaries.hparams_values(self.config,
                                                             self.steps_per_epoch))
        with self.train_writer.as_default(step=self.step):
            summaries.write_inputs(inputs, augmented=self.config.augment)

    # -- the outer loop (custom loop) -----------------------------------------
    def train(self, inner: InnerLoop, iterator) -> None:
        """Trains from the current step to the end of the last epoch, one
        boundary at a time: ``inner`` runs the steps, the controller acts."""
        while self.step < self.total_steps:
            step = self.next_stop(self.step)
            logs = inner.train(iterator, step - self.step)
            self.after_train(step, logs)
            if step % self.steps_per_epoch == 0:
                self.end_epoch(step, logs)
                inner.reset()

    # -- decisions -------------------------------------------------------------
    def next_stop(self, step: int) -> int:
        """The furthest step one inner-loop call may run to: the next log,
        checkpoint, profiler or epoch boundary, and, while stop signals are
        watched, the end of one ``steps_per_execution`` call (where a stop
        request is seen)."""
        c = self.config
        stop = min(self.total_steps, (step // self.steps_per_epoch + 1) * self.steps_per_epoch,
                   (step // c.log_every + 1) * c.log_every)
        if self.signals is not None:
            stop = min(stop, step + c.steps_per_execution)
        if c.checkpoint_every:
            stop = min(stop, (step // c.checkpoint_every + 1) * c.checkpoint_every)
        for boundary in self._profile_boundaries():
            if boundary > step:
                stop = min(stop, boundary)
        return stop

    def after_train(self, step: int, logs: Mapping) -> None:
        """After an inner-loop call (or a fit call) that trained up to ``step``;
        ``logs``: running epoch loss/accuracy."""
        before, self.step = self.step, step
        epoch_end = step % self.steps_per_epoch == 0
        if _crossed(before, step, self.config.log_every) or epoch_end:
            self._log_train(step, logs)
        if _crossed(before, step, self.config.checkpoint_every) and not epoch_end:
            self._save()
        self._profile(step)
        if not epoch_end:  # end_epoch stops after it has evaluated and saved
            self.stop_if_asked()

    def end_epoch(self, step: int, logs: Mapping) -> None:
        """Evaluates, records the epoch, checkpoints."""
        self.step = step
        result = self.evaluate()
        epoch = -(-step // self.steps_per_epoch)
        print(f"epoch {epoch}/{self.config.epochs} test_loss {result['test_loss']:.4f} "
              f"test_accuracy {result['test_accuracy']:.4f} "
              f"({result['test_examples']} examples)", flush=True)
        with self.eval_writer.as_default(step=step):
            tf.summary.scalar("loss", result["test_loss"])
            tf.summary.scalar("accuracy", result["test_accuracy"])
            summaries.write_evaluation(self.evaluator.details)
        self.history["train_loss"].append(float(logs["loss"]))
        self.history["train_accuracy"].append(float(logs["accuracy"]))
        self.history["test_loss"].append(result["test_loss"])
        self.history["test_accuracy"].append(result["test_accuracy"])
        self._save()
        self.stop_if_asked()

    def stop_if_asked(self) -> None:
        """On a stop signal (to this or, multi-worker, any worker): saves this
        step (unless saved) and raises `Stopped`."""
        if self.signals is None:
            return
        request = self.signals.requested(self._share)
        if request is None:
            return
        signum, here = request
        if self._saved_step != self.step:
            self._save()
        raise Stopped(signum,
                      f"{signal.Signals(signum).name} received"
                      f"{'' if here else ' by another worker'}: stopped at step "
                      f"{self.step}/{self.total_steps}, saved "
                      f"{self._checkpoint_path(self.restore_dir)}; rerun the same command "
                      "to resume")

    def evaluate(self) -> dict:
        """Evaluates, checking before and after that the data is still the run's."""
        self.check_inputs()
        result = self.evaluator()
        self.check_inputs()
        self.result = result
        return self.result

    def close(self) -> None:
        """Stops a running profile (also after a failure: one profiler per process)
        and gives the stop signals back their earlier handlers."""
        if self.signals is not None:
            self.signals.release()
        if self._profiling:
            tf.profiler.experimental.stop()
            self._profiling = False

    def finish(self) -> dict:
        """Stops a running profile, flushes, and returns the results."""
        self.close()
        if self.step == self.start_step or not self.result:
            self.evaluate()  # nothing left to train: still report the test metrics
        with self.run_writer.as_default(step=self.step):
            summaries.write_test_metrics(self.result)
        for writer in (self.train_writer, self.eval_writer, self.run_writer):
            writer.flush()
        return {"train_steps": int(self.optimizer.iterations.numpy()),
                "resumed_from_step": self.start_step, **self.result,
                "history": self.history}

    # -- actions ---------------------------------------------------------------
    def _log_train(self, step: int, logs: Mapping) -> None:
        loss, accuracy = float(logs["loss"]), float(logs["accuracy"])  # waits for the steps
        now = time.perf_counter()
        rate = ((step - self._logged_step) * self.config.global_batch_size
                / max(now - self._logged_time, 1e-9))
        self._logged_step, self._logged_time = step, now
        if self.print_steps:
            epoch = -(-step // self.steps_per_epoch)
            print(f"step {step}/{self.total_steps} epoch {epoch}/{self.config.epochs} "
                  f"loss {loss:.4f} accuracy {accuracy:.4f} {rate:.0f} examples/s",
                  flush=True)
        with self.train_writer.as_default(step=step):
            tf.summary.scalar("loss", loss)
            tf.summary.scalar("accuracy", accuracy)
            tf.summary.scalar("examples_per_second", rate)

    def _save(self) -> None:
        self.check_inputs()
        self.state.assign(json.dumps({
            "model": self.config.model, "history": self.history,
            "settings": resume.saved_settings(self.config, self.steps_per_epoch)}))
        try:
            self.manager.save(checkpoint_number=self.step)
        except tf.errors.OpError as e:
            raise self._save_error(e) from None
        self._saved_step = self.step

    def _save_error(self, error: tf.errors.OpError) -> TrainerError:
        """Removes the half-written checkpoint (``ckpt-N_temp``, or names it if
        that fails too) and names the checkpoint a rerun resumes from."""
        left = outputs.discard_partial(self._checkpoint_path() + "_temp")
        latest = tf.train.latest_checkpoint(self.manager.directory) or "step 0"
        return TrainerError(f"{self._checkpoint_path()}: cannot save the checkpoint "
                            f"({os_reason(error)}); a rerun resumes from {latest}{left}")

    def _checkpoint_path(self, directory: str = "") -> str:
        """This step's checkpoint in ``directory`` (default: where this worker saves)."""
        return join_path(directory or self.manager.directory,
                         f"{checkpoints.PREFIX}-{self.step}")

    def _profile_boundaries(self) -> tuple[int, ...]:
        if self.config.profile_steps is None:
            return ()
        start, end = self.config.profile_steps
        return (start - 1, end)

    def _profile(self, step: int) -> None:
        """Traces global steps START..END of ``--profile_steps`` (as whole calls)."""
        if self.config.profile_steps is None:
            return
        start, end = self.config.profile_steps
        if not self._profiling and start - 1 <= step < end:
            tf.profiler.experimental.start(self.logs_dir)
            self._profiling = True
        elif self._profiling and step >= end:
            tf.profiler.experimental.stop()
            self._profiling = False
            log.info("profile of steps %d-%d in %s/plugins/profile", start, end,
                     self.logs_dir)


def _saved_state(checkpoint_path: str) -> dict:
    """The JSON state saved with a checkpoint ({} for one without it)."""
    try:
        raw = tf.train.load_checkpoint(checkpoint_path).get_tensor(_STATE_KEY)
    except (KeyError, ValueError, tf.errors.OpError):
        return {}
    try:
        return json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else raw) or {}
    except (ValueError, UnicodeDecodeError):
        return {}
