"""The model's two random layers, whose randomness a checkpoint carries, so a
resumed run draws exactly what an uninterrupted one would.

`StepDropout`: dropout whose masks are a function of the step.

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

`RandomAffine`: data augmentation as a model layer: small random rotations,
shifts and zooms.

Why not Keras' own ``RandomRotation`` / ``RandomTranslation``: they warp with
``ImageProjectiveTransformV3``, which XLA cannot compile, so a model holding
them fails under ``jit_compile`` (the TPU path). `RandomAffine` does the same
warp with ops XLA compiles everywhere (elementwise maths and a batched
``tf.gather``), so the augmentation runs on the accelerator inside the
compiled step.

Its random numbers come from a ``tf.random.Generator`` that the layer owns
(seeded from Python's ``random``, which ``--seed`` seeds). The generator's state is a
variable, so it is saved in checkpoints and a resumed run continues the same
stream; created inside ``strategy.scope()`` it gives every replica its own
stream. At inference (``training`` false) the layer passes images through
untouched, and `trainer.model.export` leaves it out of the served model altogether.
"""

from __future__ import annotations

import math
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


def affine_warp(images: tf.Tensor, angle: tf.Tensor, scale: tf.Tensor,
                shift: tf.Tensor) -> tf.Tensor:
    """Rotates, zooms and shifts each image about its centre (bilinear, zero fill).

    ``images`` [B,H,W,C]; ``angle`` [B] radians (clockwise as displayed), ``scale``
    [B] (>1 enlarges the digit), ``shift`` [B,2] pixels (dy, dx). Each output
    pixel samples the input at the inverse-mapped position; positions outside
    the image read 0 (the background of MNIST digits).
    """
    shape = tf.shape(images)
    batch = shape[0]
    height, width, channels = images.shape[1], images.shape[2], images.shape[3]
    ys, xs = tf.meshgrid(tf.range(height, dtype=tf.float32),
                         tf.range(width, dtype=tf.float32), indexing="ij")
    cy, cx = (height - 1) / 2.0, (width - 1) / 2.0
    cos = (tf.cos(angle) / scale)[:, None, None]
    sin = (tf.sin(angle) / scale)[:, None, None]
    dy = ys[None] - cy - shift[:, 0, None, None]
    dx = xs[None] - cx - shift[:, 1, None, None]
    src_x = cos * dx + sin * dy + cx
    src_y = -sin * dx + cos * dy + cy
    x0, y0 = tf.floor(src_x), tf.floor(src_y)
    wx, wy = src_x - x0, src_y - y0
    flat = tf.reshape(images, [batch, height * width, channels])

    def tap(y, x, weight):
        inside = (x >= 0) & (x <= width - 1) & (y >= 0) & (y <= height - 1)
        index = (tf.cast(tf.clip_by_value(y, 0, height - 1), tf.int32) * width
                 + tf.cast(tf.clip_by_value(x, 0, width - 1), tf.int32))
        values = tf.gather(flat, tf.reshape(index, [batch, height * width]), batch_dims=1)
        weight = tf.where(inside, weight, 0.0)
        return values * tf.cast(tf.reshape(weight, [batch, height * width, 1]), images.dtype)

    out = (tap(y0, x0, (1 - wx) * (1 - wy)) + tap(y0, x0 + 1, wx * (1 - wy))
           + tap(y0 + 1, x0, (1 - wx) * wy) + tap(y0 + 1, x0 + 1, wx * wy))
    return tf.reshape(out, shape)


class RandomAffine(keras.layers.Layer):
    """Training-time random rotation (±``rotation`` degrees), zoom (±``zoom``)
    and shift (±``shift`` pixels per axis), drawn independently per image."""

    def __init__(self, rotation: float = 10.0, zoom: float = 0.1, shift: float = 2.0,
                 seed=None, **kwargs):
        super().__init__(**kwargs)
        self.rotation, self.zoom, self.shift, self.seed = rotation, zoom, shift, seed
        if seed is None:  # keras.utils.set_random_seed makes this reproducible
            seed = random.randint(1, 10**9)
        with tf.init_scope():
            self._generator = tf.random.Generator.from_seed(seed)

    def call(self, images, training=None):
        if training is None:
            training = keras.backend.learning_phase()
        return tf.__internal__.smart_cond.smart_cond(
            training, lambda: self._augment(images), lambda: tf.identity(images))

    def _augment(self, images):
        batch = tf.shape(images)[0]
        uniform = self._generator.uniform
        limit = self.rotation * math.pi / 180.0
        angle = uniform([batch], -limit, limit)
        scale = 1.0 + uniform([batch], -self.zoom, self.zoom)
        shift = uniform([batch, 2], -self.shift, self.shift)
        return affine_warp(images, angle, scale, shift)

    def get_config(self):
        return {**super().get_config(), "rotation": self.rotation, "zoom": self.zoom,
                "shift": self.shift, "seed": self.seed}
