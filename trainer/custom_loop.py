"""A hand-written distributed training loop (the guide's "custom training loop").

Why a second loop: it shows, and lets you control, what ``Model.fit`` does
under a strategy. Its pieces:

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
* Evaluation takes the padded, weighted batches of `trainer.data` and
  weights every metric, so padding does not count.
* ``tf.train.CheckpointManager`` saves model + optimizer (whose
  ``iterations`` is the global step) at every epoch end and, with
  ``checkpoint_every=N``, every N steps; a restart in the same
  ``model_dir`` resumes from the latest checkpoint at its step. The input
  pipeline's state is not checkpointed: with a seed its order is
  reproducible, and the resumed input skips the batches the restored steps
  consumed (see `trainer.data`); without one it draws a fresh shuffle.
"""

from __future__ import annotations

import logging
import time

import trainer  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TF loads)
import tensorflow as tf
import tf_keras as keras

import mnist_contract as contract
from mnist_contract import join_path
from trainer import data, export, model as model_lib, outputs
from trainer.config import TrainConfig

log = logging.getLogger(__name__)


class CustomLoop:
    """Model, optimizer, metrics and the compiled train/eval functions."""

    def __init__(self, config: TrainConfig, strategy: tf.distribute.Strategy,
                 total_steps: int):
        self.strategy = strategy
        self.config = config
        with strategy.scope():
            self.model = model_lib.build_model(config.model, augment=config.augment)
            self.optimizer = model_lib.make_optimizer(
                config.learning_rate, config.lr_schedule, total_steps,
                config.warmup_steps)
            self.optimizer.build(self.model.trainable_variables)
            self.train_loss = keras.metrics.Mean(name="loss")
            self.train_accuracy = keras.metrics.SparseCategoricalAccuracy(name="accuracy")
            self.test_metrics = model_lib.eval_metrics()
        step = self._train_step
        if config.jit_compile:
            step = tf.function(step, jit_compile=True)
        self.replica_step = step

    # -- per replica ---------------------------------------------------------
    def _train_step(self, batch):
        images, labels = batch[contract.IMAGE_KEY], batch[contract.LABEL_KEY]
        with tf.GradientTape() as tape:
            logits = self.model(images, training=True)
            per_example = keras.losses.sparse_categorical_crossentropy(
                labels, logits, from_logits=True)
            loss = tf.nn.compute_average_loss(
                per_example, global_batch_size=self.config.global_batch_size)
            if self.model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(self.model.losses))
        grads = tape.gradient(loss, self.model.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
        # Each replica's loss is its share of the global mean; scale it back.
        self.train_loss.update_state(loss * self.strategy.num_replicas_in_sync)
        self.train_accuracy.update_state(labels, logits)

    def _eval_step(self, batch):
        logits = self.model(batch[contract.IMAGE_KEY], training=False)
        for metric in self.test_metrics:
            metric.update_state(batch[contract.LABEL_KEY], logits,
                                sample_weight=batch[data.WEIGHT_KEY])

    # -- compiled loops --------------------------------------------------------
    @tf.function
    def _train_steps(self, iterator, steps):
        for _ in tf.range(steps):
            self.strategy.run(self.replica_step, args=(next(iterator),))

    @tf.function
    def _train_one(self, iterator):
        self.strategy.run(self.replica_step, args=(next(iterator),))

    @tf.function
    def _eval_steps(self, iterator, steps):
        for _ in tf.range(steps):
            self.strategy.run(self._eval_step, args=(next(iterator),))

    def train(self, iterator, steps: int) -> None:
        """Runs ``steps`` training steps, ``steps_per_execution`` per call."""
        chunk = self.config.steps_per_execution
        done = 0
        while done < steps:
            n = min(chunk, steps - done)
            if chunk == 1:
                self._train_one(iterator)
            else:
                self._train_steps(iterator, tf.constant(n))
            done += n

    def evaluate(self, dist_dataset, steps: int) -> dict:
        for metric in self.test_metrics:
            metric.reset_state()
        self._eval_steps(iter(dist_dataset), tf.constant(steps))
        r = {m.name: float(m.result()) for m in self.test_metrics}
        return {"test_loss": r["xent"], "test_accuracy": r["accuracy"],
                "test_examples": int(round(r["examples"]))}


def run(config: TrainConfig, strategy: tf.distribute.Strategy, train: data.SplitInput,
        test: data.SplitInput, steps_per_epoch: int) -> dict:
    """Trains (resuming from ``model_dir``), evaluates, exports; returns metrics."""
    model_dir = config.model_dir
    spe, total = steps_per_epoch, config.epochs * steps_per_epoch
    loop = CustomLoop(config, strategy, total)
    ckpt = tf.train.Checkpoint(model=loop.model, optimizer=loop.optimizer)
    manager = tf.train.CheckpointManager(
        ckpt, outputs.write_dir(model_dir, outputs.CHECKPOINTS, strategy),
        max_to_keep=config.keep_checkpoints, step_counter=loop.optimizer.iterations)
    outputs.log_write_dirs(model_dir, strategy)
    if manager.latest_checkpoint:
        ckpt.restore(manager.latest_checkpoint).assert_existing_objects_matched()
        log.info("restored %s", manager.latest_checkpoint)
    start = int(loop.optimizer.iterations.numpy())
    # Built after the restore, so that a seeded input can skip what was consumed.
    train_ds = train.distribute(strategy, start_step=start)
    test_ds = test.distribute(strategy)
    eval_steps = test.steps

    logs_dir = outputs.write_dir(model_dir, outputs.LOGS, strategy)
    train_writer = tf.summary.create_file_writer(join_path(logs_dir, "train"))
    test_writer = tf.summary.create_file_writer(join_path(logs_dir, "validation"))

    if start:
        print(f"resuming at step {start}/{total}", flush=True)
    history = {"train_loss": [], "train_accuracy": [], "test_loss": [], "test_accuracy": []}
    iterator = iter(train_ds)
    step = start
    result = {}
    while step < total:
        epoch = step // spe
        epoch_end = (epoch + 1) * spe
        loop.train_loss.reset_state()
        loop.train_accuracy.reset_state()
        while step < epoch_end:
            # Run up to the next progress line (a multiple of log_every), the
            # next mid-epoch checkpoint or the epoch end.
            stop = min(epoch_end, (step // config.log_every + 1) * config.log_every)
            every = config.checkpoint_every
            if every:
                stop = min(stop, (step // every + 1) * every)
            t0 = time.perf_counter()
            loop.train(iterator, stop - step)
            loss = float(loop.train_loss.result())  # waits for the steps to finish
            seconds = time.perf_counter() - t0
            rate = (stop - step) * config.global_batch_size / max(seconds, 1e-9)
            step = stop
            accuracy = float(loop.train_accuracy.result())
            print(f"step {step}/{total} epoch {epoch + 1}/{config.epochs} "
                  f"loss {loss:.4f} accuracy {accuracy:.4f} {rate:.0f} examples/s",
                  flush=True)
            with train_writer.as_default(step=step):
                tf.summary.scalar("loss", loss)
                tf.summary.scalar("accuracy", accuracy)
                tf.summary.scalar("examples_per_second", rate)
            if every and step % every == 0 and step < epoch_end:
                manager.save(checkpoint_number=step)
        result = loop.evaluate(test_ds, eval_steps)
        print(f"epoch {epoch + 1}/{config.epochs} test_loss {result['test_loss']:.4f} "
              f"test_accuracy {result['test_accuracy']:.4f} "
              f"({result['test_examples']} examples)", flush=True)
        with test_writer.as_default(step=step):
            tf.summary.scalar("loss", result["test_loss"])
            tf.summary.scalar("accuracy", result["test_accuracy"])
        history["train_loss"].append(float(loop.train_loss.result()))
        history["train_accuracy"].append(float(loop.train_accuracy.result()))
        history["test_loss"].append(result["test_loss"])
        history["test_accuracy"].append(result["test_accuracy"])
        manager.save(checkpoint_number=step)
    train_writer.flush()
    test_writer.flush()

    if step == start:  # nothing left to train: still report the test metrics
        result = loop.evaluate(test_ds, eval_steps)
    export.export_model(loop.model, outputs.write_dir(model_dir, outputs.EXPORT, strategy))
    outputs.discard_scratch(model_dir, strategy)
    return {"train_steps": int(loop.optimizer.iterations.numpy()),
            "resumed_from_step": start, **result, "history": history}
