"""Exact evaluation of the padded, weighted eval stream (`trainer.data.input_pipeline.eval_input`).

The evaluator keeps its own metrics rather than the model's compiled ones,
so ``test_loss`` means one thing in both loops: the mean cross-entropy over
the real test examples (no L2 term, padding excluded); and
``test_examples`` is counted (the sum of the weights), not computed, so a
pass that read more or fewer examples than the manifest lists fails.

The same pass also fills the confusion matrix and keeps the first
misclassified digits (`trainer.loop.eval_metrics`); `Evaluator.details` holds
the last pass's, for TensorBoard.
"""

from __future__ import annotations

import numpy as np

import tensorflow as tf
import tf_keras as keras

import mnist_contract as contract
from trainer.data import checks, input_pipeline
from trainer.loop import eval_metrics

MISCLASSIFIED_KEPT = 25  # misclassified test digits kept per pass (and per replica)


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
            self.confusion = eval_metrics.ConfusionMatrix()
            self.misclassified = eval_metrics.Misclassified(
                MISCLASSIFIED_KEPT, strategy.num_replicas_in_sync)
        self.details: eval_metrics.EvalDetails | None = None
        # One iterator for the run: the stream repeats in whole passes.
        self.iterator = iter(dataset)

    def _step(self, batch):
        logits = self.model(batch[contract.IMAGE_KEY], training=False)
        weights, labels = batch[input_pipeline.WEIGHT_KEY], batch[contract.LABEL_KEY]
        for metric in self.metrics.values():
            metric.update_state(labels, logits, sample_weight=weights)
        self.count.update_state(weights)
        predictions = tf.argmax(logits, axis=-1, output_type=labels.dtype)
        self.confusion.update_state(labels, predictions, sample_weight=weights)
        self.misclassified.update_state(batch[contract.IMAGE_KEY], labels, predictions,
                                        batch[contract.INDEX_KEY], weights)

    @tf.function
    def _run(self, iterator, steps):
        for _ in tf.range(steps):
            self.strategy.run(self._step, args=(next(iterator),))

    def __call__(self) -> dict:
        for metric in (*self.metrics.values(), self.count, self.confusion,
                       self.misclassified):
            metric.reset_state()
        self._run(self.iterator, tf.constant(self.steps))
        counted = int(round(float(self.count.result())))
        checks.check_eval_count(counted, self.expected_examples, self.origin)
        self.details = eval_metrics.EvalDetails(
            confusion=np.rint(self.confusion.result().numpy()).astype(np.int64),
            **self.misclassified.read(MISCLASSIFIED_KEPT))
        return {"test_loss": float(self.metrics["xent"].result()),
                "test_accuracy": float(self.metrics["accuracy"].result()),
                "test_examples": counted}
