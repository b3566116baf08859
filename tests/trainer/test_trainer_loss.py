"""The training loss (`trainer.model.loss`): label smoothing's targets, and both
loops training on it."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import mnist_contract as contract
from trainer.config import TrainConfig
from trainer.loop import custom_loop
from trainer.model import loss as loss_lib
from trainer.model import models as model_lib

RNG = np.random.default_rng(0)
LOGITS = RNG.normal(size=(6, contract.NUM_CLASSES)).astype(np.float32) * 3
LABELS = np.array([0, 3, 9, 9, 1, 5], dtype=np.int64)


def _expected(labels, logits, smoothing):
    targets = np.full(logits.shape, smoothing / contract.NUM_CLASSES)
    targets[np.arange(len(labels)), labels] += 1 - smoothing
    log_p = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    return -(targets * log_p).sum(axis=1)


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.5])
def test_each_example_is_scored_against_the_smoothed_targets(smoothing):
    got = loss_lib.per_example_loss(tf.constant(LABELS), tf.constant(LOGITS), smoothing)
    np.testing.assert_allclose(got.numpy(), _expected(LABELS, LOGITS, smoothing),
                               rtol=1e-5)
    # Labels shaped [batch, 1], as Keras hands them to a compiled loss.
    column = loss_lib.per_example_loss(tf.constant(LABELS[:, None]), tf.constant(LOGITS),
                                       smoothing)
    np.testing.assert_allclose(column.numpy(), got.numpy(), rtol=1e-6)


def test_the_compiled_loss_is_the_mean_and_survives_its_config():
    loss = loss_lib.TrainLoss(0.2)
    assert float(loss(LABELS, LOGITS)) == pytest.approx(
        _expected(LABELS, LOGITS, 0.2).mean(), rel=1e-5)
    again = loss_lib.TrainLoss.from_config(loss.get_config())
    assert again.label_smoothing == 0.2


def _batch(n=16):
    rng = np.random.default_rng(1)
    return {contract.IMAGE_KEY: rng.random((n, *contract.IMAGE_SHAPE), np.float32),
            contract.LABEL_KEY: rng.integers(0, 10, n)}


@pytest.mark.parametrize("loop", ["keras", "custom"])
def test_both_loops_train_on_the_smoothed_loss(loop):
    """The first step's reported loss is the smoothed cross-entropy of the
    initial weights (plus their L2 penalty), not the one-hot one."""
    tf.keras.utils.set_random_seed(0)
    batch = _batch()
    config = TrainConfig(data="d", model_dir="m", loop=loop, label_smoothing=0.4,
                         global_batch_size=16, steps_per_execution=1)
    strategy = tf.distribute.get_strategy()
    model, optimizer = model_lib.build(config, strategy, total_steps=1)
    head = model.get_layer("logits").kernel
    head.assign(head * 50.0)  # confident logits, where smoothing shows
    logits = model(batch[contract.IMAGE_KEY]).numpy()
    penalty = float(tf.add_n(model.losses))
    smoothed = _expected(batch[contract.LABEL_KEY], logits, 0.4).mean() + penalty
    one_hot = _expected(batch[contract.LABEL_KEY], logits, 0.0).mean() + penalty
    assert abs(smoothed - one_hot) > 0.05
    dataset = tf.data.Dataset.from_tensors(batch).repeat()
    if loop == "keras":
        pairs = dataset.map(lambda b: (b[contract.IMAGE_KEY], b[contract.LABEL_KEY]))
        reported = model.fit(pairs, epochs=1, steps_per_epoch=1,
                             verbose=0).history["loss"][0]
    else:
        inner = custom_loop.CustomLoop(
            config, strategy, model, optimizer,
            lambda step: strategy.experimental_distribute_dataset(dataset))
        inner.start(0)
        reported = float(inner.train(1)["loss"])
    assert reported == pytest.approx(smoothed, rel=1e-4)
