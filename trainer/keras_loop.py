"""Training with ``Model.fit``: steps_per_execution, BackupAndRestore, export.

``steps_per_execution=N`` makes Keras run N steps inside one ``tf.function``
call; on a TPU that removes a host round trip per step (the "Use TPUs" guide
reports ~1.5x), and on CPU it removes Python and dispatch overhead.

The evaluation split comes padded (see `trainer.data`), with a weight per
example; the metrics are ``weighted_metrics`` so padding counts for nothing,
and ``test_examples`` is counted by a metric rather than computed.
"""

from __future__ import annotations

from typing import Sequence

import trainer  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TF loads)
import tensorflow as tf
import tf_keras as keras

from pipeline.contract import join_path
from trainer import data, model as model_lib, outputs


class _ResumeRecorder(keras.callbacks.Callback):
    """Notes the optimizer step at which fit starts (after BackupAndRestore)."""

    def __init__(self):
        super().__init__()
        self.start_step = 0

    def on_train_begin(self, logs=None):
        self.start_step = int(self.model.optimizer.iterations.numpy())


def run(*, strategy: tf.distribute.Strategy, model_name: str, learning_rate: float,
        train: data.SplitInput, test: data.SplitInput, model_dir: str, epochs: int,
        steps_per_epoch: int, steps_per_execution: int, jit_compile: bool,
        verbose: int, callbacks: Sequence[keras.callbacks.Callback] = ()) -> dict:
    """Fits, evaluates and exports; returns the common metrics dict."""
    with strategy.scope():
        model = model_lib.build_model(model_name)
        model.compile(
            optimizer=keras.optimizers.Adam(learning_rate),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            weighted_metrics=model_lib.eval_metrics(),
            steps_per_execution=steps_per_execution,
            jit_compile=jit_compile)
    train_ds = train.distribute(strategy)
    test_ds = test.distribute(strategy)
    eval_steps = test.steps

    recorder = _ResumeRecorder()
    checkpoint_path = join_path(
        outputs.write_dir(model_dir, outputs.CHECKPOINTS, strategy), "epoch-{epoch:04d}")
    cbs = [
        # BackupAndRestore first: it restores weights, optimizer and epoch in
        # on_train_begin, before the recorder reads the step.
        keras.callbacks.BackupAndRestore(join_path(model_dir, outputs.BACKUP)),
        recorder,
        keras.callbacks.ModelCheckpoint(checkpoint_path, save_weights_only=True),
        keras.callbacks.TensorBoard(
            outputs.write_dir(model_dir, outputs.LOGS, strategy), profile_batch=0),
        *callbacks,
    ]
    history = model.fit(train_ds, epochs=epochs, steps_per_epoch=steps_per_epoch,
                        validation_data=test_ds, validation_steps=eval_steps,
                        callbacks=cbs, verbose=verbose)
    results = model.evaluate(test_ds, steps=eval_steps, return_dict=True, verbose=0)

    export_dir = outputs.write_dir(model_dir, outputs.EXPORT, strategy)
    model.save(export_dir, save_format="tf")
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
