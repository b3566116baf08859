"""Exact evaluation of the padded, weighted eval stream (`trainer.data.eval_input`).

The evaluator keeps its own metrics rather than the model's compiled ones,
so ``test_loss`` means one thing in both loops: the mean cross-entropy over
the real test examples (no L2 term, padding excluded); and
``test_examples`` is counted (the sum of the weights), not computed, so a
pass that read more or fewer examples than the manifest lists fails.
"""

from __future__ import annotations

import trainer  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TF loads)
import tensorflow as tf
import tf_keras as keras

import mnist_contract as contract
from trainer import checks, data


class Evaluator:
    """Weighted accuracy, cross-entropy and example count over one eval pass."""

    def __init__(self, strategy: tf.distribute.Strategy, model: keras.Model,
                 dataset, steps: int, *, expected_examples: int, origin: str):
        self.strategy, self.model, self.steps = strategy, model, steps
        # Every pass must count exactly the examples `origin` (the manifest) lists.
        self.expected_examples, self.origin = expected_examples, origin
        with strategy.scope():
            self.metrics = {
                "accuracy": keras.metrics.SparseCategoricalAccuracy(),
                "xent": keras.metrics.SparseCategoricalCrossentropy(from_logits=True),
            }
            self.count = keras.metrics.Sum()
        # One iterator for the run: the stream repeats in whole passes.
        self.iterator = iter(dataset)

    def _step(self, batch):
        logits = self.model(batch[contract.IMAGE_KEY], training=False)
        weights = batch[data.WEIGHT_KEY]
        for metric in self.metrics.values():
            metric.update_state(batch[contract.LABEL_KEY], logits, sample_weight=weights)
        self.count.update_state(weights)

    @tf.function
    def _run(self, iterator, steps):
        for _ in tf.range(steps):
            self.strategy.run(self._step, args=(next(iterator),))

    def __call__(self) -> dict:
        for metric in (*self.metrics.values(), self.count):
            metric.reset_state()
        self._run(self.iterator, tf.constant(self.steps))
        counted = int(round(float(self.count.result())))
        checks.check_eval_count(counted, self.expected_examples, self.origin)
        return {"test_loss": float(self.metrics["xent"].result()),
                "test_accuracy": float(self.metrics["accuracy"].result()),
                "test_examples": counted}
