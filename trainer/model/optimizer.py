"""The optimizer (``--optimizer``, ``--weight_decay``) and its learning-rate
schedule (``--learning_rate``, ``--lr_schedule``, ``--warmup_steps``): Adam
(AdamW with weight decay), LAMB or LARS with a linear warmup, then a constant
rate or a cosine decay to 0 at the last step.

Adam's weight decay is decoupled (Loshchilov and Hutter, "Decoupled Weight
Decay Regularization", ICLR 2019); LAMB and LARS add it to the step their
trust ratio scales, as their papers define. As in the BERT, LAMB, MLPerf
ResNet and Flax recipes it applies to weight matrices and kernels only:
biases and batch-norm scales and offsets are not decayed (`is_weight_matrix`).
tf-keras 2.20/2.21 ship neither LAMB nor LARS (TensorFlow Addons had LAMB and
is end-of-life).
"""

from __future__ import annotations

import tensorflow as tf
import tf_keras as keras

from trainer.errors import TrainerError
from trainer.config import OPTIMIZERS, SCHEDULES


def make_optimizer(learning_rate: float, schedule: str, total_steps: int,
                   warmup_steps: int, name: str = "adam",
                   weight_decay: float = 0.0) -> keras.optimizers.Optimizer:
    """``name`` (Adam, AdamW with a weight decay, `Lamb` or `Lars`) with the
    learning rate of `learning_rate_schedule`; `build_optimizer` builds it for
    a model."""
    if name not in OPTIMIZERS:
        raise TrainerError(f"unknown --optimizer {name!r} (have {list(OPTIMIZERS)})")
    if not 0 <= weight_decay < float("inf"):
        raise TrainerError(f"bad --weight_decay {weight_decay} (must be >= 0)")
    rate = learning_rate_schedule(learning_rate, schedule, total_steps, warmup_steps)
    if name == "lamb":
        return Lamb(rate, weight_decay_rate=weight_decay)
    if name == "lars":
        return Lars(rate, weight_decay_rate=weight_decay)
    if weight_decay:
        return keras.optimizers.AdamW(rate, weight_decay=weight_decay)
    return keras.optimizers.Adam(rate)


def is_weight_matrix(variable: tf.Variable) -> bool:
    """Whether ``variable`` is a kernel or weight matrix, which weight decay and
    LAMB's and LARS's trust ratios apply to, not a vector (a bias, a
    batch-norm scale or offset)."""
    return variable.shape.rank > 1


def build_optimizer(optimizer: keras.optimizers.Optimizer, variables: list) -> None:
    """Creates ``optimizer``'s slots for ``variables`` (so a checkpoint restore
    fills every one), after excluding the vectors from AdamW's decay (tf-keras'
    ``exclude_from_weight_decay``, which must come before ``build``; `Lamb`
    and `Lars` ask `is_weight_matrix` themselves)."""
    if optimizer.weight_decay is not None:
        optimizer.exclude_from_weight_decay(
            var_list=[v for v in variables if not is_weight_matrix(v)])
    optimizer.build(variables)


class _LayerwiseOptimizer(keras.optimizers.Optimizer):
    """What LAMB and LARS share: a first-moment slot per variable (and with
    ``SECOND_MOMENTS`` a second, created after all the first ones, the order
    their checkpoints hold), the decay ``λ`` (``weight_decay_rate``) and the
    trust ratio that scales each weight matrix's step."""

    SECOND_MOMENTS = False

    def __init__(self, learning_rate, weight_decay_rate: float, name: str, **kwargs):
        super().__init__(name=name, **kwargs)
        self._learning_rate = self._build_learning_rate(learning_rate)
        self.weight_decay_rate = weight_decay_rate

    def build(self, var_list):
        super().build(var_list)
        if getattr(self, "_built", False):
            return
        self._built = True
        self._momentums = [self.add_variable_from_reference(v, "m") for v in var_list]
        if self.SECOND_MOMENTS:
            self._velocities = [self.add_variable_from_reference(v, "v") for v in var_list]

    def _index(self, variable) -> int:
        return self._index_dict[self._var_key(variable)]

    def _trust_scaled(self, step: tf.Tensor, variable, scale=1.0):
        """(``rate``, ``step``): for a weight matrix ``w``, ``step + λw`` and the
        learning rate times ``scale · ‖w‖ / ‖step + λw‖`` (1 where a norm is 0);
        for a vector, ``step`` and the learning rate as they are."""
        dtype = variable.dtype
        rate = tf.cast(self.learning_rate, dtype)
        if not is_weight_matrix(variable):
            return rate, step
        if self.weight_decay_rate:
            step += tf.cast(self.weight_decay_rate, dtype) * variable
        w_norm, s_norm = tf.norm(variable), tf.norm(step)
        ratio = tf.where((w_norm > 0) & (s_norm > 0),
                         tf.cast(scale, dtype) * w_norm / s_norm, tf.ones_like(w_norm))
        return rate * ratio, step

    def get_config(self):
        return {**super().get_config(),
                "learning_rate": self._serialize_hyperparameter(self._learning_rate),
                "weight_decay_rate": self.weight_decay_rate}


class Lamb(_LayerwiseOptimizer):
    """LAMB (You et al., "Large Batch Optimization for Deep Learning: Training
    BERT in 76 minutes", ICLR 2020, Algorithm 2): Adam's bias-corrected step
    plus the weight decay, ``r = m̂ / (√v̂ + ε) + λw``, rescaled for each weight
    matrix ``w`` by the trust ratio ``‖w‖ / ‖r‖``, so that every layer moves by
    the same fraction (the learning rate) of its norm whatever the batch size.

    Vectors (biases, batch-norm scales and offsets) take Adam's step as is,
    undecayed, as in the BERT and Flax recipes that exclude them from layer
    adaptation: a zero-initialized bias has no norm to scale by. The decay
    ``λ`` is ``weight_decay_rate``: Keras' own ``weight_decay`` would subtract
    it after the trust ratio, outside the step LAMB defines.
    """

    SECOND_MOMENTS = True

    def __init__(self, learning_rate=1e-3, beta_1: float = 0.9, beta_2: float = 0.999,
                 epsilon: float = 1e-6, weight_decay_rate: float = 0.0,
                 name: str = "Lamb", **kwargs):
        super().__init__(learning_rate, weight_decay_rate, name, **kwargs)
        self.beta_1, self.beta_2, self.epsilon = beta_1, beta_2, epsilon

    def update_step(self, gradient, variable):
        index = self._index(variable)
        m, v = self._momentums[index], self._velocities[index]
        dtype = variable.dtype
        step = tf.cast(self.iterations + 1, dtype)
        m.assign_add((gradient - m) * (1 - self.beta_1))
        v.assign_add((tf.square(gradient) - v) * (1 - self.beta_2))
        m_hat = m / (1 - tf.pow(tf.cast(self.beta_1, dtype), step))
        v_hat = v / (1 - tf.pow(tf.cast(self.beta_2, dtype), step))
        rate, update = self._trust_scaled(m_hat / (tf.sqrt(v_hat) + self.epsilon), variable)
        variable.assign_sub(rate * update)

    def get_config(self):
        return {**super().get_config(), "beta_1": self.beta_1, "beta_2": self.beta_2,
                "epsilon": self.epsilon}


class Lars(_LayerwiseOptimizer):
    """LARS (You, Gitman and Ginsburg, "Large Batch Training of Convolutional
    Networks", 2017; the form of the MLPerf ResNet-50 references): momentum
    SGD whose step for each weight matrix ``w`` is the gradient plus the
    weight decay, ``g + λw``, scaled by the trust ratio ``η‖w‖ / ‖g + λw‖``,
    so that before momentum every layer moves by the learning rate times ``η``
    of its norm. ``v ← μv + rate · ratio · (g + λw)``; ``w ← w − v``.

    Vectors take plain momentum SGD, undecayed, as in those references.
    """

    def __init__(self, learning_rate=1.0, momentum: float = 0.9, eta: float = 1e-3,
                 weight_decay_rate: float = 0.0, name: str = "Lars", **kwargs):
        super().__init__(learning_rate, weight_decay_rate, name, **kwargs)
        self.momentum, self.eta = momentum, eta

    def update_step(self, gradient, variable):
        v = self._momentums[self._index(variable)]
        rate, step = self._trust_scaled(gradient, variable, scale=self.eta)
        v.assign(tf.cast(self.momentum, variable.dtype) * v + rate * step)
        variable.assign_sub(v)

    def get_config(self):
        return {**super().get_config(), "momentum": self.momentum, "eta": self.eta}


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

