"""The models: the "Use TPUs" guide's CNN and a narrower one for CPUs.

Both are built by `build_model`, which must run inside ``strategy.scope()``
so that variables are created as mirrored/TPU variables. Under the
``mixed_bfloat16`` policy the layers compute in bfloat16 (the TPU's native
matmul type) while the last layer is forced to float32, so logits, the
softmax cross-entropy and the metrics keep full precision.
"""

from __future__ import annotations

import trainer  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TF loads)
import tf_keras as keras

import mnist_contract as contract
from trainer.config import TrainerError

# (conv filters, conv filters, dense units, dense units)
WIDTHS = {
    "guide": (256, 256, 256, 128),  # tensorflow.org/guide/tpu
    "small": (8, 8, 32, 32),
}
L2 = 1e-5  # the guide's kernel_regularizer


def set_precision(mixed_precision: str) -> None:
    """Sets Keras' global dtype policy (``'bfloat16'`` → mixed_bfloat16)."""
    policies = {"none": "float32", "bfloat16": "mixed_bfloat16"}
    if mixed_precision not in policies:
        raise TrainerError(f"unknown --mixed_precision {mixed_precision!r}")
    keras.mixed_precision.set_global_policy(policies[mixed_precision])


def build_model(name: str = "small") -> keras.Model:
    """The guide's architecture (two 3x3 convs, three dense layers), at a width.

    Outputs logits (no softmax), in float32 whatever the policy.
    """
    if name not in WIDTHS:
        raise TrainerError(f"unknown --model {name!r} (have {sorted(WIDTHS)})")
    c1, c2, d1, d2 = WIDTHS[name]
    reg = keras.regularizers.L2(L2)
    return keras.Sequential([
        keras.layers.Input(shape=contract.IMAGE_SHAPE, name="image"),
        keras.layers.Conv2D(c1, 3, activation="relu", kernel_regularizer=reg),
        keras.layers.Conv2D(c2, 3, activation="relu", kernel_regularizer=reg),
        keras.layers.Flatten(),
        keras.layers.Dense(d1, activation="relu", kernel_regularizer=reg),
        keras.layers.Dense(d2, activation="relu", kernel_regularizer=reg),
        keras.layers.Dense(contract.NUM_CLASSES, kernel_regularizer=reg,
                           dtype="float32", name="logits"),
    ], name=f"mnist_{name}")


class ExampleCount(keras.metrics.Sum):
    """Counts examples by their sample weight (eval padding has weight 0)."""

    def __init__(self, name: str = "examples", **kwargs):
        super().__init__(name=name, **kwargs)

    def update_state(self, y_true, y_pred=None, sample_weight=None):
        ones = keras.backend.cast(keras.backend.ones_like(y_true), self.dtype)
        return super().update_state(ones, sample_weight=sample_weight)


def eval_metrics() -> list[keras.metrics.Metric]:
    """Weighted metrics shared by both loops: exact over the real examples.

    ``xent`` is the mean cross-entropy over weighted examples, which is what
    both loops report as ``test_loss`` (Keras' own ``loss`` divides by the
    padded batch size and adds the L2 term, so it is not used for that).
    """
    return [
        keras.metrics.SparseCategoricalAccuracy(name="accuracy"),
        keras.metrics.SparseCategoricalCrossentropy(from_logits=True, name="xent"),
        ExampleCount(name="examples"),
    ]
