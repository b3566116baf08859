"""The private TensorFlow internals the trainer relies on, each in one
place: three private attributes of strategies and variables
(`in_multi_worker_mode`, `variable_strategy`, `is_default_strategy`).

None has a public equivalent. Each attribute is read defensively (a missing
one gives the single-worker answer), and each reach names the versions it
was checked against: TensorFlow 2.21.0 with tf-keras 2.21.0 (the project's
pins) and, on a Cloud TPU VM, tensorflow-tpu 2.20.0 with tf-keras 2.20.x.
A TensorFlow upgrade should re-check each.
"""

from __future__ import annotations

import tensorflow as tf


def in_multi_worker_mode(strategy: tf.distribute.Strategy) -> bool:
    """Whether ``strategy`` spans several worker processes.

    ``StrategyExtended._in_multi_worker_mode()`` (TF 2.21.0, tensorflow-tpu
    2.20.0): defined by every strategy's ``extended``; true for a
    MultiWorkerMirroredStrategy whose TF_CONFIG lists more than one task.
    """
    return bool(getattr(strategy.extended, "_in_multi_worker_mode", lambda: False)())


def variable_strategy(variable: tf.Variable) -> tf.distribute.Strategy | None:
    """The strategy a (distributed) variable was created under, else None.

    ``DistributedVariable._distribute_strategy`` (TF 2.21.0, tensorflow-tpu
    2.20.0; tf-keras 2.21.0 / 2.20.x hand these variables out unchanged):
    mirrored, TPU and multi-worker variables carry it; plain variables do
    not have the attribute.
    """
    return getattr(variable, "_distribute_strategy", None)


def is_default_strategy(strategy: tf.distribute.Strategy) -> bool:
    """Whether ``strategy`` is TensorFlow's no-op (single-device) default.

    Its class, ``_DefaultDistributionStrategy`` (TF 2.21.0, tensorflow-tpu
    2.20.0), is private and has no public base of its own; it is matched by
    name so that nothing imports TensorFlow's private modules.
    """
    return type(strategy).__name__ == "_DefaultDistributionStrategy"
