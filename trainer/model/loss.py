"""The training loss (``--label_smoothing``), one definition for both loops.

Softmax cross-entropy from the integer labels the data contract carries. With
label smoothing ``s`` the target is ``(1 - s)`` on the label plus ``s / 10`` on
every class, which keeps the logits from growing without bound once the
training digits are fitted. Evaluation (the per-epoch test pass, the exported
model's compiled loss) keeps the plain cross-entropy, so reported losses stay
comparable between runs with and without smoothing.
"""

from __future__ import annotations

import tensorflow as tf
import tf_keras as keras

import mnist_contract as contract


def per_example_loss(labels: tf.Tensor, logits: tf.Tensor,
                     label_smoothing: float = 0.0) -> tf.Tensor:
    """Cross-entropy of each example: ``labels`` integer classes, ``logits``
    float32 scores of shape ``[batch, 10]``."""
    if not label_smoothing:
        return keras.losses.sparse_categorical_crossentropy(
            labels, logits, from_logits=True)
    labels = tf.reshape(tf.cast(labels, tf.int32), [-1])
    targets = tf.one_hot(labels, contract.NUM_CLASSES, dtype=logits.dtype)
    return keras.losses.categorical_crossentropy(
        targets, logits, from_logits=True, label_smoothing=label_smoothing)


class TrainLoss(keras.losses.Loss):
    """`per_example_loss` as the loss `Model.compile` takes (mean over the
    global batch under a distribution strategy, as Keras' own losses)."""

    def __init__(self, label_smoothing: float = 0.0, name: str = "train_loss", **kwargs):
        super().__init__(name=name, **kwargs)
        self.label_smoothing = float(label_smoothing)

    def call(self, y_true, y_pred):
        return per_example_loss(y_true, y_pred, self.label_smoothing)

    def get_config(self):
        return {**super().get_config(), "label_smoothing": self.label_smoothing}
