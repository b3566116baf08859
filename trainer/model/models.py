"""The models and their optimizer.

* ``guide``: the "Use TPUs" guide's CNN (two 3x3 convs of 256, dense
  256/128/10, L2 1e-5). Kept for TPUs, where its width costs little.
* ``small``: the same layers, 8/8/32/32 wide; a quick model for tests.
* ``convnet``: the CPU recipe. The classic Keras MNIST convnet
  (conv-pool-conv-pool, dropout before the classifier) with a dense layer
  of 128, trained with augmentation (`trainer.model.layers`) and a warmup +
  cosine learning-rate schedule (`make_optimizer`).
* ``convnet_bn``: deeper, for the best accuracy: two pairs of 3x3 convs
  (32, 64), each conv batch-normalized, each pair pooled, then the same
  dropout and dense layer of 128. About 3.8x ``convnet``'s multiply-adds
  (~1.75x its epoch time on 2 CPU cores with augmentation).

All are built by `build_model`, which must run inside ``strategy.scope()``
(`build` makes the model and its optimizer there)
so that variables are created as mirrored/TPU variables. Under the
``mixed_bfloat16`` policy the layers compute in bfloat16 (the TPU's native
matmul type) while the last layer is forced to float32, so logits, the
softmax cross-entropy and the metrics keep full precision. Inputs are
float images in [0, 1]; the export (`trainer.model.export`) wraps the model with
the uint8 → [0, 1] step so that served models take raw pixels.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Callable, Iterator, Optional

import tensorflow as tf
import tf_keras as keras

import mnist_contract as contract
from trainer.errors import TrainerError
from trainer.model.layers import RandomAffine, StepDropout
from trainer.model.loss import TrainLoss
from trainer.model.optimizer import build_optimizer, make_optimizer
from trainer.config import MODELS, PRECISIONS
from trainer.run.plan import ModelSpec

log = logging.getLogger(__name__)

# (conv filters, conv filters, dense units, dense units)
GUIDE_WIDTHS = {
    "guide": (256, 256, 256, 128),  # tensorflow.org/guide/tpu
    "small": (8, 8, 32, 32),
}
L2 = 1e-5  # the guide's kernel_regularizer


def set_precision(mixed_precision: str) -> None:
    """Sets Keras' global dtype policy (``'bfloat16'`` → mixed_bfloat16)."""
    policies = dict(zip(PRECISIONS, ("float32", "mixed_bfloat16")))
    if mixed_precision not in policies:
        raise TrainerError(f"unknown --mixed_precision {mixed_precision!r}")
    keras.mixed_precision.set_global_policy(policies[mixed_precision])


@contextlib.contextmanager
def precision(mixed_precision: str) -> Iterator[None]:
    """Inside the block, Keras builds and runs models under ``--mixed_precision``;
    float32 again after it, also after a failure."""
    set_precision(mixed_precision)
    try:
        yield
    finally:
        set_precision("none")


def _guide_layers(name: str) -> list[keras.layers.Layer]:
    """The guide's architecture (two 3x3 convs, three dense layers), at a width."""
    c1, c2, d1, d2 = GUIDE_WIDTHS[name]
    reg = keras.regularizers.L2(L2)
    return [
        keras.layers.Conv2D(c1, 3, activation="relu", kernel_regularizer=reg),
        keras.layers.Conv2D(c2, 3, activation="relu", kernel_regularizer=reg),
        keras.layers.Flatten(),
        keras.layers.Dense(d1, activation="relu", kernel_regularizer=reg),
        keras.layers.Dense(d2, activation="relu", kernel_regularizer=reg),
        keras.layers.Dense(contract.NUM_CLASSES, kernel_regularizer=reg,
                           dtype="float32", name="logits"),
    ]


def _convnet_features() -> list[keras.layers.Layer]:
    """The classic Keras MNIST convnet's features (conv 32, pool, conv 64, pool);
    with `_dropout_classifier`: 0.23M parameters."""
    return [
        keras.layers.Conv2D(32, 3, activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(64, 3, activation="relu"), keras.layers.MaxPooling2D(),
    ]


def _convnet_bn_features(virtual_batch_size: Optional[int] = None
                         ) -> list[keras.layers.Layer]:
    """Two pairs of 3x3 convs (32, 64) with batch normalization, each pair pooled.

    The moving statistics' momentum is 0.9, not Keras' 0.99: with 0.99 they
    still carry ~40% of their initial values after 93 steps, and a 3-epoch
    run of the cpu preset on 4,000 digits evaluated at 0.10 (0.95 with 0.9);
    at batch 1024 (48 steps an epoch) evaluations stayed near 0.10 for the
    first 7 epochs while training accuracy was above 0.97.

    ``virtual_batch_size``: Keras' ghost batch normalization, which in
    training normalizes each group of that many examples of a replica's
    batch by the group's own statistics; at inference it changes nothing.
    """
    def conv(filters):
        return [keras.layers.Conv2D(filters, 3, use_bias=False),
                keras.layers.BatchNormalization(momentum=0.9,
                                                virtual_batch_size=virtual_batch_size),
                keras.layers.ReLU()]
    return [*conv(32), *conv(32), keras.layers.MaxPooling2D(),
            *conv(64), *conv(64), keras.layers.MaxPooling2D()]


def _dropout_classifier(step: Optional[Callable[[], tf.Tensor]],
                        dropout: float) -> list[keras.layers.Layer]:
    """The convnets' classifier: dropout, a dense layer of 128, dropout, the
    logits. The dropout masks follow the step (`trainer.model.layers`)."""
    return [
        keras.layers.Flatten(),
        StepDropout(dropout, step=step),
        keras.layers.Dense(128, activation="relu"),
        StepDropout(dropout, step=step),
        keras.layers.Dense(contract.NUM_CLASSES, dtype="float32", name="logits"),
    ]


def build_model(name: str = "small", *, augment: bool = False,
                step: Optional[Callable[[], tf.Tensor]] = None,
                bn_virtual_batch_size: int = 0, dropout: float = 0.4) -> keras.Model:
    """An uncompiled model from [0, 1] float images to float32 logits.

    ``augment`` puts a `RandomAffine` layer first: random rotations (±10°),
    zooms (±10%) and shifts (±2 px) while training, nothing at inference.
    ``step`` gives the global step the dropout masks follow (`build`: the
    optimizer's); without it dropout is Keras' own.
    ``bn_virtual_batch_size`` (0: off) is ``convnet_bn``'s ghost batch size.
    ``dropout`` is the rate of ``convnet``'s and ``convnet_bn``'s two dropout
    layers (``guide`` and ``small`` have none).
    """
    if name not in MODELS:
        raise TrainerError(f"unknown --model {name!r} (have {list(MODELS)})")
    if name in GUIDE_WIDTHS:
        body = _guide_layers(name)
    else:
        features = (_convnet_bn_features(bn_virtual_batch_size or None)
                    if name == "convnet_bn" else _convnet_features())
        body = features + _dropout_classifier(step, dropout)
    head = [RandomAffine(name="augment")] if augment else []
    return keras.Sequential(
        [keras.layers.Input(shape=contract.IMAGE_SHAPE, name="image"), *head, *body],
        name=f"mnist_{name}")


def warn_long_warmup(spec: ModelSpec, warmup_steps: int, total_steps: int) -> None:
    """A warning when the warmup is longer than the run: the schedule cuts it
    to the run (`trainer.model.optimizer`), so the learning rate reaches its
    peak only at the last step and never decays."""
    if warmup_steps > total_steps:
        flag = (f"--warmup_epochs={spec.warmup_epochs:g} ({warmup_steps} steps)"
                if spec.warmup_epochs else f"--warmup_steps={warmup_steps}")
        log.warning("%s is longer than the run's %d steps: the warmup is cut to the run, "
                    "and the learning rate reaches --learning_rate=%g only at its last step",
                    flag, total_steps, spec.learning_rate)


def build(spec: ModelSpec, strategy: tf.distribute.Strategy, total_steps: int, *,
          warmup_steps: int = 0,
          ghost_batch_size: int = 0) -> tuple[keras.Model, keras.optimizers.Optimizer]:
    """The model and its optimizer, inside ``strategy.scope()``.

    ``spec``: the flags of the model and its optimizer (`trainer.run.plan.ModelSpec`);
    ``total_steps`` and ``warmup_steps`` shape the learning-rate schedule,
    ``ghost_batch_size`` is ``convnet_bn``'s (`trainer.run.plan.Plan`).
    The optimizer is built (its slots exist), so a checkpoint restore fills
    every slot; the model is compiled (with ``steps_per_execution`` for the
    Keras loop), so the export loads ready to use.
    """
    warn_long_warmup(spec, warmup_steps, total_steps)
    with strategy.scope():
        # The layers, then their optimizer, then the loss. The dropout masks
        # follow the optimizer's step, which the layers read only in training.
        model = build_model(spec.model, augment=spec.augment,
                            step=lambda: optimizer.iterations, dropout=spec.dropout,
                            bn_virtual_batch_size=ghost_batch_size)
        optimizer = make_optimizer(spec.learning_rate, spec.lr_schedule,
                                   total_steps, warmup_steps,
                                   spec.optimizer, spec.weight_decay)
        build_optimizer(optimizer, model.trainable_variables)
        model.compile(optimizer=optimizer,
                      loss=TrainLoss(spec.label_smoothing),
                      metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
                      steps_per_execution=spec.steps_per_execution,
                      jit_compile=spec.jit_compile)
    return model, optimizer
