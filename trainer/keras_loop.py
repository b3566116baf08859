"""Training with ``Model.fit``: steps_per_execution, BackupAndRestore, export.

``steps_per_execution=N`` makes Keras run N steps inside one ``tf.function``
call; on a TPU that removes a host round trip per step (the "Use TPUs" guide
reports ~1.5x), and on CPU it removes Python and dispatch overhead.

Preemption: ``BackupAndRestore`` backs up model, optimizer and position in
``model_dir/backup`` at every epoch end and, with ``checkpoint_every=N``,
every N steps; a run started again after a kill restores them and continues
at the next step. tf-keras 2.21's own ``save_freq=N`` is not used for the
mid-epoch backups: it counts calls of the train function (N *
steps_per_execution steps) and records the *first* step of the last call as
the one done, so a run resumed from it would repeat steps_per_execution - 1
steps (`_Backup` records the last one). Because the dataset is built
before ``fit`` restores anything, the step is read from the backup first
(`backed_up_step`) so that a seeded input can skip the batches it consumed.

The evaluation split comes padded (see `trainer.data`), with a weight per
example; the metrics are ``weighted_metrics`` so padding counts for nothing,
and ``test_examples`` is counted by a metric rather than computed.
"""

from __future__ import annotations

import logging
from typing import Sequence

import trainer  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TF loads)
import tensorflow as tf
import tf_keras as keras

from mnist_contract import join_path
from trainer import data, export, model as model_lib, outputs
from trainer.config import TrainConfig

log = logging.getLogger(__name__)

# BackupAndRestore keeps its checkpoints in this subdirectory of its backup
# dir (all workers read it; tf_keras/src/distribute/worker_training_state.py).
_BACKUP_READ_DIR = "chief"
_ITERATIONS_KEY = "model/optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"


def backed_up_step(backup_dir: str) -> int:
    """The optimizer step of the latest BackupAndRestore backup (0: none)."""
    latest = tf.train.latest_checkpoint(join_path(backup_dir, _BACKUP_READ_DIR))
    if not latest:
        return 0
    try:
        return int(tf.train.load_checkpoint(latest).get_tensor(_ITERATIONS_KEY))
    except (KeyError, tf.errors.OpError) as e:  # not a backup this code wrote
        log.warning("%s: no optimizer step in the backup (%s)", latest, e)
        return 0


class _Backup(keras.callbacks.BackupAndRestore):
    """BackupAndRestore at epoch ends and, if ``every``, each ``every`` steps.

    A mid-epoch backup happens after the train-function call that reaches a
    multiple of ``every`` global steps, and records that call's *last* step
    as done (see the module docstring for why the base class' ``save_freq``
    is not enough).
    """

    def __init__(self, backup_dir: str, every: int, steps_per_epoch: int):
        super().__init__(backup_dir, save_freq=every if every else "epoch")
        self._every = every
        self._steps_per_epoch = steps_per_epoch
        self._done = 0

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)  # restores the backup, if any
        self._done = int(self.model.optimizer.iterations.numpy())

    def on_train_batch_end(self, batch, logs=None):
        # `batch`: the index in the epoch of the last step this call ran.
        self._training_state.backup_if_preempted()
        done = self._current_epoch * self._steps_per_epoch + batch + 1
        if self._every and done // self._every > self._done // self._every:
            self._training_state._ckpt_saved_batch.assign(batch)
            self._backup(epoch=self._current_epoch, batch=batch)
        self._done = done

    def on_epoch_end(self, epoch, logs=None):
        if self._every:  # batch-level bookkeeping: "last step of the epoch done"
            self._training_state._ckpt_saved_batch.assign(self._steps_per_epoch - 1)
        self._backup(epoch=epoch, batch=self._steps_per_epoch - 1)


class _ResumeRecorder(keras.callbacks.Callback):
    """Notes the optimizer step at which fit starts (after BackupAndRestore)."""

    def __init__(self, total_steps: int):
        super().__init__()
        self.total_steps = total_steps
        self.start_step = 0

    def on_train_begin(self, logs=None):
        self.start_step = int(self.model.optimizer.iterations.numpy())
        if self.start_step:
            print(f"resuming at step {self.start_step}/{self.total_steps}", flush=True)


def run(config: TrainConfig, strategy: tf.distribute.Strategy, train: data.SplitInput,
        test: data.SplitInput, steps_per_epoch: int,
        callbacks: Sequence[keras.callbacks.Callback] = ()) -> dict:
    """Fits (resuming an interrupted run), evaluates and exports; returns metrics."""
    model_dir, epochs = config.model_dir, config.epochs
    with strategy.scope():
        model = model_lib.build_model(config.model, augment=config.augment)
        model.compile(
            optimizer=model_lib.make_optimizer(
                config.learning_rate, config.lr_schedule, epochs * steps_per_epoch,
                config.warmup_steps),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            weighted_metrics=model_lib.eval_metrics(),
            steps_per_execution=config.steps_per_execution,
            jit_compile=config.jit_compile)
    backup_dir = join_path(model_dir, outputs.BACKUP)
    start_step = backed_up_step(backup_dir)
    train_ds = train.distribute(strategy, start_step=start_step)
    test_ds = test.distribute(strategy)
    eval_steps = test.steps

    recorder = _ResumeRecorder(epochs * steps_per_epoch)
    checkpoints_dir = outputs.write_dir(model_dir, outputs.CHECKPOINTS, strategy)
    outputs.log_write_dirs(model_dir, strategy)
    checkpoint_path = join_path(checkpoints_dir, "epoch-{epoch:04d}")
    cbs = [
        # The backup first: it restores weights, optimizer and position in
        # on_train_begin, before the recorder reads the step.
        _Backup(backup_dir, config.checkpoint_every, steps_per_epoch),
        recorder,
        keras.callbacks.ModelCheckpoint(checkpoint_path, save_weights_only=True),
        keras.callbacks.TensorBoard(
            outputs.write_dir(model_dir, outputs.LOGS, strategy), profile_batch=0),
        *callbacks,
    ]
    history = model.fit(train_ds, epochs=epochs, steps_per_epoch=steps_per_epoch,
                        validation_data=test_ds, validation_steps=eval_steps,
                        callbacks=cbs, verbose=config.verbose)
    if recorder.start_step != start_step:  # the input skipped the wrong count
        log.warning("BackupAndRestore resumed at step %d, the input at step %d",
                    recorder.start_step, start_step)
    results = model.evaluate(test_ds, steps=eval_steps, return_dict=True, verbose=0)

    export_dir = outputs.write_dir(model_dir, outputs.EXPORT, strategy)
    export.export_model(model, export_dir)
    outputs.discard_scratch(model_dir, strategy)

    h = history.history
    return {
        "train_steps": int(model.optimizer.iterations.numpy()),
        "resumed_from_step": recorder.start_step,
        "test_loss": float(results["xent"]),
        "test_accuracy": float(results["accuracy"]),
        "test_examples": int(round(results["examples"])),
        "history": {
            "train_loss": [float(v) for v in h.get("loss", [])],
            "train_accuracy": [float(v) for v in h.get("accuracy", [])],
            "test_loss": [float(v) for v in h.get("val_xent", [])],
            "test_accuracy": [float(v) for v in h.get("val_accuracy", [])],
        },
    }
