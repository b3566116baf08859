"""The optimizer and its learning-rate schedule (``--learning_rate``,
``--lr_schedule``, ``--warmup_steps``): Adam with a linear warmup, then a
constant rate or a cosine decay to 0 at the last step.
"""

from __future__ import annotations

import trainer  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TF loads)
import tf_keras as keras

from trainer.errors import TrainerError
from trainer.names import SCHEDULES


def make_optimizer(learning_rate: float, schedule: str, total_steps: int,
                   warmup_steps: int) -> keras.optimizers.Optimizer:
    """Adam with the learning rate of `learning_rate_schedule`."""
    return keras.optimizers.Adam(
        learning_rate_schedule(learning_rate, schedule, total_steps, warmup_steps))


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

