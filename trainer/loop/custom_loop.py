"""The custom inner loop (the guide's "custom training loop").

Why a second loop: it shows, and lets you control, what ``Model.fit`` does
under a strategy. Only the steps are here, in the shape of Orbit's
``StandardTrainer``: `CustomLoop.train` runs the number of steps it is
given and returns the running epoch metrics. The outer loop (how many steps
each call runs, and the logging, checkpoints, evaluation and profiling at
each boundary) is `trainer.loop.controller.Controller.train`; model, optimizer,
restore and export come from the shared skeleton as for the Keras loop, and
`trainer.loop.build.build_controller` builds both loops the same way.

* ``_train_step`` runs on every replica via ``strategy.run``. The loss is
  ``tf.nn.compute_average_loss(per_example, global_batch_size=...)`` (each
  replica divides by the *global* batch so that summing gradients across
  replicas gives the mean) plus ``tf.nn.scale_regularization_loss`` of the
  L2 terms (likewise divided by the number of replicas).
* Multi-step execution: ``_train_steps`` is one ``tf.function`` whose body is
  ``for _ in tf.range(steps)``, which AutoGraph turns into a ``tf.while_loop``
  that runs on the worker (on a TPU: on the device) without returning to
  Python between steps. The loop owns the ``tf.function``; the step is plain
  Python, so the two compose. ``steps`` is a tensor, so a shorter last chunk
  does not retrace. ``steps_per_execution=1`` uses ``_train_one``, a
  ``tf.function`` without the loop.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import tensorflow as tf
import tf_keras as keras

import mnist_contract as contract
from trainer.model.loss import per_example_loss
from trainer.run.plan import StepSettings


class CustomLoop:
    """Train metrics and the compiled train functions for a model and optimizer.

    ``train_stream(step)`` gives the distributed training dataset as it stands
    at global step ``step`` (`trainer.data.input_pipeline.train_input`).
    """

    drives_itself = False  # the controller calls `train` to each boundary
    prints_progress = False  # the controller prints a line per log boundary

    def __init__(self, settings: StepSettings, strategy: tf.distribute.Strategy,
                 model: keras.Model, optimizer, train_stream: Callable[[int], Any]):
        self.settings, self.strategy = settings, strategy
        self.model, self.optimizer = model, optimizer
        self.train_stream, self.iterator = train_stream, None
        with strategy.scope():
            self.train_loss = keras.metrics.Mean(name="loss")
            self.train_accuracy = keras.metrics.SparseCategoricalAccuracy(name="accuracy")
        step = self._train_step
        if settings.jit_compile:
            step = tf.function(step, jit_compile=True)
        self.replica_step = step

    def _train_step(self, batch):
        images, labels = batch[contract.IMAGE_KEY], batch[contract.LABEL_KEY]
        with tf.GradientTape() as tape:
            logits = self.model(images, training=True)
            per_example = per_example_loss(labels, logits,
                                           self.settings.label_smoothing)
            loss = tf.nn.compute_average_loss(
                per_example, global_batch_size=self.settings.global_batch_size)
            if self.model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(self.model.losses))
        grads = tape.gradient(loss, self.model.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
        # Each replica's loss is its share of the global mean; scale it back.
        self.train_loss.update_state(loss * self.strategy.num_replicas_in_sync)
        self.train_accuracy.update_state(labels, logits)

    @tf.function
    def _train_steps(self, iterator, steps):
        for _ in tf.range(steps):
            self.strategy.run(self.replica_step, args=(next(iterator),))

    @tf.function
    def _train_one(self, iterator):
        self.strategy.run(self.replica_step, args=(next(iterator),))

    def start(self, step: int) -> None:
        """Opens the training stream resumed at global step ``step``."""
        self.iterator = iter(self.train_stream(step))

    def train(self, steps: int) -> Mapping:
        """Runs ``steps`` training steps, ``steps_per_execution`` per call;
        returns the running epoch metrics (`logs`)."""
        chunk = self.settings.steps_per_execution
        done = 0
        while done < steps:
            n = min(chunk, steps - done)
            if chunk == 1:
                self._train_one(self.iterator)
            else:
                self._train_steps(self.iterator, tf.constant(n))
            done += n
        return self.logs()

    def logs(self) -> Mapping:
        """The running epoch means, as Keras reports them; read only when used."""
        return _Logs({"loss": self.train_loss, "accuracy": self.train_accuracy})

    def reset(self) -> None:
        self.train_loss.reset_state()
        self.train_accuracy.reset_state()


class _Logs(Mapping):
    """Metric name → result, computed on access (reading one waits for the steps)."""

    def __init__(self, metrics: dict):
        self._metrics = metrics

    def __getitem__(self, key):
        return self._metrics[key].result()

    def __iter__(self):
        return iter(self._metrics)

    def __len__(self):
        return len(self._metrics)

