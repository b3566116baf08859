"""Batch normalization's statistics recomputed after the last step
(``--bn_recalibration_examples``).

During training each batch-norm layer keeps running averages (momentum 0.9
in `trainer.model.models`) of the batch statistics of augmented images,
dominated by the last few batches; inference normalizes with them. After
the last step this pass replaces them with the statistics of the layer's
inputs over a fixed sample of train examples (the first ones of the train
split in file order, unaugmented, as the test split is seen), layer after
layer, each computed with the layers before it already recomputed, as
PreciseBN does (Wu & Johnson, "Rethinking 'Batch' in BatchNorm", 2021);
what it gains is measured in docs/benchmarks.md (recipes on all of MNIST).

The sample is read through the exact eval stream
(`trainer.data.input_pipeline.eval_input`), so padding rows weigh 0, every
replica and worker adds its share, and the same examples are used on every
rerun: a resumed run recomputes the same statistics.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import tensorflow as tf
import tf_keras as keras

import mnist_contract as contract
from trainer.data import input_pipeline


def recalibration(strategy: tf.distribute.Strategy, model: keras.Model,
                  sample: Callable[[], tuple[Any, int]], examples: int,
                  global_batch_size: int, available: int) -> Callable[[], None]:
    """The pass that recomputes ``model``'s batch-norm statistics over the
    first ``examples`` (``--bn_recalibration_examples``) of the ``available``
    train examples, and says so in one line; nothing without batch-norm
    layers or with 0 examples.

    ``sample()`` gives the eval stream over the train split and its steps per
    pass, built when the pass runs (at the last step), not before.
    """
    layers = batch_norm_layers(model)
    if not (layers and examples):
        return lambda: None

    def recalibrate():
        start = time.perf_counter()
        dataset, per_pass = sample()
        steps = recalibration_steps(examples, global_batch_size, per_pass)
        Recalibrator(strategy, model, dataset, steps)()
        seen = min(steps * global_batch_size, available)
        print(f"batch norm: statistics of {len(layers)} layers recomputed over "
              f"{seen} train examples in {time.perf_counter() - start:.1f} s",
              flush=True)
    return recalibrate


def batch_norm_layers(model: keras.Model) -> list[keras.layers.BatchNormalization]:
    """The model's batch-norm layers, in the order they compute."""
    return [l for l in model.layers if isinstance(l, keras.layers.BatchNormalization)]


def recalibration_steps(examples: int, global_batch_size: int, steps_per_pass: int) -> int:
    """Global steps of the eval stream that cover ``examples`` (at most one pass)."""
    return min(steps_per_pass, math.ceil(examples / global_batch_size))


class Recalibrator:
    """Recomputes every batch-norm layer's moving mean and variance; ``dataset``
    gives a fresh iterator over the same batches each time."""

    def __init__(self, strategy: tf.distribute.Strategy, model: keras.Model,
                 dataset, steps: int):
        self.strategy, self.model, self.dataset, self.steps = strategy, model, dataset, steps
        self.layers = batch_norm_layers(model)

    def __call__(self) -> None:
        for layer in self.layers:
            mean, variance = self._statistics(layer)
            # Ghost batch norm keeps them as [1, 1, ..., channels].
            layer.moving_mean.assign(tf.reshape(mean, layer.moving_mean.shape))
            layer.moving_variance.assign(tf.reshape(variance, layer.moving_variance.shape))

    def _statistics(self, layer: keras.layers.BatchNormalization):
        """The mean and variance of ``layer``'s inputs over the sample, per channel."""
        probe = keras.Model(self.model.inputs, layer.input)
        channels = layer.moving_mean.shape[-1:]
        with self.strategy.scope():
            sums = [keras.metrics.MeanTensor(shape=channels) for _ in range(3)]
        run = tf.function(self._pass(probe, sums))
        run(iter(self.dataset), tf.constant(self.steps))
        mean, within, squares = (s.result() for s in sums)
        # Law of total variance: the batches' own variance plus their means'.
        return mean, within + tf.maximum(squares - tf.square(mean), 0.0)

    def _pass(self, probe: keras.Model, sums) -> Callable:
        def step(batch):
            x = tf.cast(probe(batch[contract.IMAGE_KEY], training=False), tf.float32)
            weights = tf.cast(batch[input_pipeline.WEIGHT_KEY], tf.float32)
            weights = tf.reshape(weights, [-1] + [1] * (x.shape.rank - 1))
            axes = list(range(x.shape.rank - 1))
            count = tf.reduce_sum(weights * tf.ones_like(x[..., :1]))
            mean = tf.math.divide_no_nan(tf.reduce_sum(weights * x, axes), count)
            within = tf.math.divide_no_nan(
                tf.reduce_sum(weights * tf.square(x - mean), axes), count)
            for metric, value in zip(sums, (mean, within, tf.square(mean))):
                metric.update_state(value, sample_weight=count)

        def run(iterator, steps):
            for _ in tf.range(steps):
                self.strategy.run(step, args=(next(iterator),))
        return run
