"""What an evaluation pass keeps besides loss and accuracy: the confusion matrix
and the first misclassified test digits, for TensorBoard (`trainer.loop.summaries`).

Both are Keras metrics, so they accumulate inside the evaluator's one pass
(`trainer.loop.evaluator.Evaluator`, in the same ``strategy.run`` step) and their
variables are per-replica sums (``ON_READ``, ``SUM``): read after the pass,
each is the total over every replica and worker. Both take the eval
stream's weights, so padding rows count nowhere.

`Misclassified` keeps a bounded, deterministic sample without a second pass:
each replica writes the first ``capacity`` misclassified examples it reads
into its own block of rows (the other replicas' rows stay zero on it), so the
sum across replicas is every replica's sample side by side, in replica
order. The update is a one-hot matrix product rather than a scatter: static
shapes, no out-of-range indices, and XLA compiles it (the TPU path).
"""

from __future__ import annotations

import dataclasses

import numpy as np

import tensorflow as tf
import tf_keras as keras

import mnist_contract as contract

# Columns of `Misclassified.meta`: 1 for a filled row, then the example's numbers.
_FILLED, _PREDICTED, _LABEL, _INDEX = range(4)


@dataclasses.dataclass(frozen=True)
class EvalDetails:
    """One pass's confusion matrix and its first misclassified examples."""

    confusion: np.ndarray   # int64 [classes, classes]: rows true, columns predicted
    images: np.ndarray      # float32 [n, 28, 28, 1] in [0, 1]
    predicted: np.ndarray   # int64 [n]
    labels: np.ndarray      # int64 [n]
    indices: np.ndarray     # int64 [n]: the examples' `index` feature


class _ArrayMetric(keras.metrics.Metric):
    """A metric whose variables are arrays (Keras' own reset assigns a scalar 0)."""

    def reset_state(self):
        keras.backend.batch_set_value([(v, np.zeros(v.shape)) for v in self.variables])


class ConfusionMatrix(_ArrayMetric):
    """Weighted counts of (true class, predicted class)."""

    def __init__(self, num_classes: int = contract.NUM_CLASSES, name="confusion_matrix",
                 **kwargs):
        super().__init__(name=name, **kwargs)
        self.num_classes = num_classes
        self.counts = self.add_weight("counts", shape=(num_classes, num_classes),
                                      initializer="zeros")

    def update_state(self, labels, predictions, sample_weight=None):
        self.counts.assign_add(tf.math.confusion_matrix(
            labels, predictions, self.num_classes, weights=sample_weight,
            dtype=self.counts.dtype))

    def result(self):
        return tf.identity(self.counts)


class Misclassified(_ArrayMetric):
    """The first ``capacity`` misclassified examples of each of ``replicas`` replicas."""

    def __init__(self, capacity: int, replicas: int, name="misclassified", **kwargs):
        super().__init__(name=name, **kwargs)
        self.capacity, self.rows = capacity, capacity * replicas
        self.images = self.add_weight("images", shape=(self.rows,) + contract.IMAGE_SHAPE,
                                      initializer="zeros")
        self.meta = self.add_weight("meta", shape=(self.rows, 4), initializer="zeros")

    def update_state(self, images, labels, predictions, indices, sample_weight):
        wrong = tf.not_equal(predictions, labels) & (sample_weight > 0)
        # In a replica, the variables read this replica's own rows only.
        kept = tf.reduce_sum(self.meta[:, _FILLED])
        position = kept + tf.cumsum(tf.cast(wrong, tf.float32)) - 1.0
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        first_row = tf.cast(replica, tf.float32) * self.capacity
        row = tf.where(wrong & (position < self.capacity), first_row + position, -1.0)
        select = tf.one_hot(tf.cast(row, tf.int32), self.rows)  # [batch, rows]; -1: none
        self.images.assign_add(tf.einsum("br,bhwc->rhwc", select,
                                         tf.cast(images, self.images.dtype)))
        values = tf.stack([tf.ones_like(position), tf.cast(predictions, tf.float32),
                           tf.cast(labels, tf.float32), tf.cast(indices, tf.float32)],
                          axis=1)
        self.meta.assign_add(tf.matmul(select, values, transpose_a=True))

    def result(self):
        return tf.identity(self.meta)

    def read(self, limit: int) -> dict[str, np.ndarray]:
        """The first ``limit`` kept examples, replica by replica (`EvalDetails` fields)."""
        meta = tf.identity(self.meta).numpy()
        rows = np.flatnonzero(meta[:, _FILLED] > 0.5)[:limit]
        images = tf.identity(self.images).numpy()[rows]
        numbers = np.rint(meta[rows]).astype(np.int64)
        return {"images": images, "predicted": numbers[:, _PREDICTED],
                "labels": numbers[:, _LABEL], "indices": numbers[:, _INDEX]}
