"""The run's checkpoints: what is saved with the model, where, and how it is restored.

A checkpoint holds the model, the optimizer (its ``iterations`` is the
global step) and a JSON state (`STATE_NAME`): the model's name, the
history of every epoch so far, and the settings a resume must keep
(`trainer.run.resume`). So ``metrics.json`` after a resume holds the whole
run, and a resume with other settings is refused with one line.

Every worker restores from the chief's ``model_dir/checkpoints`` (the
others save to scratch folders, `trainer.run.outputs.Role`), skipping
damaged checkpoints (`trainer.run.checkpoint_repair`); under multi-worker
training the workers then check that they start from one step.
"""

from __future__ import annotations

import json
import logging
from typing import Callable, Mapping, Optional

import tensorflow as tf

from mnist_contract import join_path
from trainer.errors import TrainerError, os_reason
from trainer.run import checkpoint_repair, outputs, resume
from trainer.run.claim import Claim

log = logging.getLogger(__name__)

STATE_NAME = "trainer_state"  # the checkpoint's JSON: model name, history, settings
_STATE_KEY = f"{STATE_NAME}/.ATTRIBUTES/VARIABLE_VALUE"
HISTORY_KEYS = ("train_loss", "train_accuracy", "test_loss", "test_accuracy")


class RunCheckpoints:
    """Saves and restores the model, optimizer and history of one run.

    ``settings``: this run's `trainer.run.resume.saved_settings`, saved with
    each checkpoint and checked on restore; ``keep``: ``--keep_checkpoints``;
    ``restart``: ``--restart`` (the chief has deleted the checkpoints).
    ``share`` (`trainer.strategy.sum_over_replicas` over ``replicas``; None
    off multi-worker) lets the workers check that they resume at one step.
    """

    def __init__(self, model_dir: str, role: outputs.Role, model, optimizer,
                 settings: Mapping, *, keep: int = 3, restart: bool = False,
                 share: Optional[Callable] = None, replicas: int = 1,
                 claim: Optional[Claim] = None):
        self.role, self.share, self.replicas = role, share, replicas
        self.model_dir, self.keep, self.restart = model_dir, keep, restart
        # What a resume must share with this run (`trainer.run.resume.saved_settings`).
        self.settings = settings
        # Accepted after the restore's checks, checked before each save (`trainer.run.claim`).
        self.claim = claim or Claim()
        self.model, self.optimizer = model, optimizer
        self.state = tf.Variable("", dtype=tf.string, trainable=False, name=STATE_NAME)
        self.checkpoint = self._new_checkpoint()
        # Where this worker saves (a scratch folder off the chief). The manager
        # reads its state file when made: only after `restore` has repaired it.
        self.directory = role.write_dir(model_dir, outputs.CHECKPOINTS)
        self.manager: Optional[tf.train.CheckpointManager] = None
        # The chief's, which every worker restores from.
        self.restore_dir = join_path(model_dir, outputs.CHECKPOINTS)
        self.history: dict[str, list[float]] = {k: [] for k in HISTORY_KEYS}
        self.saved_step: Optional[int] = None

    def _new_checkpoint(self) -> tf.train.Checkpoint:
        return tf.train.Checkpoint(model=self.model, optimizer=self.optimizer,
                                   **{STATE_NAME: self.state})

    def _new_manager(self) -> tf.train.CheckpointManager:
        return tf.train.CheckpointManager(
            self.checkpoint, self.directory, max_to_keep=self.keep,
            step_counter=self.optimizer.iterations)

    def restore(self) -> int:
        """Restores the newest checkpoint that restores; returns the step to start from.

        Only the chief repairs the state file; with ``--restart`` (the chief
        has deleted the checkpoints) the others restore nothing. Once the
        checkpoint's settings have passed, the run is accepted (`Claim.accept`).
        """
        checkpoint_repair.clean_temp(self.directory)
        latest = ""
        if self.role.chief or not self.restart:
            latest, damaged = checkpoint_repair.restore_newest(self.restore_dir, self._restore)
        if latest:
            if self.role.chief:
                checkpoint_repair.repair_state(self.restore_dir, latest, damaged)
            log.info("restored %s", latest)
        # For the restored checkpoint object; on the chief it reads the repaired state file.
        self.manager = self._new_manager()
        step = int(self.optimizer.iterations.numpy())
        self.saved_step = step if latest else None
        self._check_same_start(step)
        self.claim.accept()
        return step

    def _restore(self, prefix: str) -> None:
        """Restores ``prefix`` after checking its settings; raises if it is damaged."""
        saved = saved_state(prefix)
        resume.check_settings(saved, self.settings, int(prefix.rsplit("-", 1)[1]),
                              prefix.rsplit("/", 1)[0], self.model_dir)
        self.checkpoint = self._new_checkpoint()
        self.checkpoint.restore(prefix).assert_existing_objects_matched()
        self.history = {k: list(saved.get("history", {}).get(k, [])) for k in HISTORY_KEYS}

    def _check_same_start(self, step: int) -> None:
        """Multi-worker: raises on every worker unless all start at one step
        (steps s_i of n replicas are all equal iff n * sum(s_i^2) == sum(s_i)^2)."""
        if self.share is None:
            return
        total, squares = self.share([step, step ** 2])
        if self.replicas * squares != total ** 2:
            self.wait_for_peers()
            raise TrainerError(
                f"{self.restore_dir}: the workers would resume at different steps (this one "
                f"at {step}); every worker must read the chief's "
                "--model_dir (shared storage, such as gs://)")

    def wait_for_peers(self) -> None:
        """Multi-worker: one more all-reduce before this worker leaves (a
        mismatch at the start, a stop on a signal); nothing otherwise.

        It completes only once every worker has finished the collective
        before it (each gives its part of this one after that one), so no
        worker loses that collective's data to a peer that already left
        ("Socket closed", "Connection reset by peer") and each ends as its
        own run says. A peer leaving during this one changes nothing: every
        worker holds what it needs by then.
        """
        if self.share is None:
            return
        try:
            self.share([0, 0])
        except (tf.errors.UnavailableError, tf.errors.AbortedError,
                tf.errors.CancelledError):
            pass

    def record_epoch(self, train_logs, result: dict) -> None:
        """Adds an epoch's train and test loss and accuracy to the history."""
        self.history["train_loss"].append(float(train_logs["loss"]))
        self.history["train_accuracy"].append(float(train_logs["accuracy"]))
        self.history["test_loss"].append(result["test_loss"])
        self.history["test_accuracy"].append(result["test_accuracy"])

    def save(self, step: int) -> None:
        """Saves ``ckpt-<step>`` with the history; a storage failure is one line."""
        self.claim.check()
        self.state.assign(json.dumps({
            "model": self.settings["model"], "history": self.history,
            "settings": dict(self.settings)}))
        try:
            self.manager.save(checkpoint_number=step)
        except tf.errors.OpError as e:
            raise self._save_error(step, e) from None
        self.saved_step = step

    def _save_error(self, step: int, error: tf.errors.OpError) -> TrainerError:
        """Removes the half-written checkpoint (``ckpt-N_temp``, or names it if
        that fails too) and names the checkpoint a rerun resumes from."""
        path = self.path(step)
        left = outputs.discard_partial(path + "_temp")
        latest = tf.train.latest_checkpoint(self.directory) or "step 0"
        return TrainerError(f"{path}: cannot save the checkpoint "
                            f"({os_reason(error)}); a rerun resumes from {latest}{left}")

    def path(self, step: int, directory: str = "") -> str:
        """The checkpoint of ``step`` in ``directory`` (default: where this worker saves)."""
        return join_path(directory or self.directory,
                         f"{checkpoint_repair.PREFIX}-{step}")


def saved_state(checkpoint_path: str) -> dict:
    """The JSON state saved with a checkpoint ({} for one without it)."""
    try:
        raw = tf.train.load_checkpoint(checkpoint_path).get_tensor(_STATE_KEY)
    except (KeyError, ValueError, tf.errors.OpError):
        return {}
    try:
        return json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else raw) or {}
    except (ValueError, UnicodeDecodeError):
        return {}
