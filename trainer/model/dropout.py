"""Dropout whose masks are a function of the step: `StepDropout`.

tf-keras' ``Dropout`` draws its masks from TensorFlow's stateful random ops,
whose state lives in the kernels, not in any variable: a checkpoint does
not hold it, and a resumed run draws other masks than an uninterrupted one
(with ``--seed``, 24 of the convnet's 28 tensors differed after a stop and
resume). `StepDropout` draws each mask with a stateless op seeded by the
layer's own seed, the global step (the optimizer's ``iterations``, which
the checkpoint holds) and the replica, so a resumed run draws exactly the
masks an uninterrupted one would, and every replica its own. It holds no
variable, so checkpoints keep their layout; at inference it passes inputs
through, and the export leaves it out (`trainer.model.export`).
"""

from __future__ import annotations

import random
from typing import Callable, Optional

import tensorflow as tf
import tf_keras as keras


class StepDropout(keras.layers.Dropout):
    """``keras.layers.Dropout``, its masks drawn from (seed, ``step()``, replica).

    Without ``step`` (a model built outside the trainer, without an
    optimizer) it is Keras' own dropout.
    """

    def __init__(self, rate: float, step: Optional[Callable[[], tf.Tensor]] = None,
                 **kwargs):
        super().__init__(rate, **kwargs)
        self._step = step
        # keras.utils.set_random_seed (--seed) makes this reproducible.
        self._base_seed = self.seed if self.seed is not None else random.randint(1, 2**31 - 1)

    def call(self, inputs, training=None):
        if self._step is None:
            return super().call(inputs, training=training)
        if training is None:
            training = keras.backend.learning_phase()
        if isinstance(training, (bool, int)):
            return self._drop(inputs) if training else inputs
        return tf.cond(tf.cast(training, tf.bool), lambda: self._drop(inputs),
                       lambda: tf.identity(inputs))

    def _drop(self, inputs):
        seed = tf.stack([tf.constant(self._base_seed, tf.int64),
                         tf.cast(self._step(), tf.int64)])
        replica = tf.distribute.get_replica_context()
        if replica is not None:
            seed = tf.random.experimental.stateless_fold_in(
                seed, tf.cast(replica.replica_id_in_sync_group, tf.int32))
        return tf.nn.experimental.stateless_dropout(
            inputs, rate=self.rate, seed=seed, noise_shape=self._get_noise_shape(inputs))
