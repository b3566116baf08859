"""The optimizer and its learning-rate schedule (``--learning_rate``,
``--lr_schedule``, ``--warmup_steps``): Adam with a linear warmup, then a
constant rate or a cosine decay to 0 at the last step.
"""

from __future__ import annotations

import trainer  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TF loads)
import tensorflow as tf
import tf_keras as keras

from trainer.errors import TrainerError
from trainer.names import SCHEDULES


class Lamb(keras.optimizers.Adam):
    """LAMB (You et al. 2019, arXiv:1904.00962) without weight decay: Adam's
    bias-corrected update, rescaled per variable by ||w|| / ||update|| (1 when
    either norm is 0), so every layer moves by the same fraction of its norm."""

    def update_step(self, gradient, variable):
        lr = tf.cast(self.learning_rate, variable.dtype)
        local_step = tf.cast(self.iterations + 1, variable.dtype)
        beta_1_power = tf.pow(tf.cast(self.beta_1, variable.dtype), local_step)
        beta_2_power = tf.pow(tf.cast(self.beta_2, variable.dtype), local_step)
        index = self._index_dict[self._var_key(variable)]
        m, v = self._momentums[index], self._velocities[index]
        m.assign_add((gradient - m) * (1 - self.beta_1))
        v.assign_add((tf.square(gradient) - v) * (1 - self.beta_2))
        update = (m / (1 - beta_1_power)) / (tf.sqrt(v / (1 - beta_2_power)) + self.epsilon)
        w_norm, u_norm = tf.norm(variable), tf.norm(update)
        ratio = tf.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, 1.0)
        variable.assign_sub(ratio * lr * update)


def make_optimizer(learning_rate: float, schedule: str, total_steps: int,
                   warmup_steps: int, name: str = "adam") -> keras.optimizers.Optimizer:
    """Adam (or `Lamb`) with the learning rate of `learning_rate_schedule`."""
    kind = Lamb if name == "lamb" else keras.optimizers.Adam
    return kind(learning_rate_schedule(learning_rate, schedule, total_steps, warmup_steps))


def learning_rate_schedule(learning_rate: float, schedule: str, total_steps: int,
                           warmup_steps: int):
    """A linear warmup from 0 over ``warmup_steps``, and then

    * ``constant``: ``learning_rate`` to the end;
    * ``cosine``: a cosine decay from ``learning_rate`` to 0 at ``total_steps``.

    Built from Keras' own ``CosineDecay`` (its ``alpha=1`` is a constant), so a
    saved optimizer needs no custom objects to load. A plain float when
    there is nothing to schedule.
    """
    if schedule not in SCHEDULES:
        raise TrainerError(f"unknown --lr_schedule {schedule!r} (have {list(SCHEDULES)})")
    if warmup_steps < 0 or total_steps < 1:
        raise TrainerError(f"bad schedule length: {total_steps} steps, "
                           f"{warmup_steps} warmup steps")
    warmup_steps = min(warmup_steps, total_steps)
    if schedule == "constant" and not warmup_steps:
        return learning_rate
    return keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0 if warmup_steps else learning_rate,
        decay_steps=max(total_steps - warmup_steps, 1),
        alpha=1.0 if schedule == "constant" else 0.0,
        warmup_target=learning_rate if warmup_steps else None,
        warmup_steps=warmup_steps)

