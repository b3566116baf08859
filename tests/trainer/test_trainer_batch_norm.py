"""Batch-norm recalibration (`trainer.loop.batch_norm`): each layer's statistics
are those of its inputs over the sample's real rows, the earlier layers
already recalibrated."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import mnist_contract as contract
from trainer.data.input_pipeline import WEIGHT_KEY
from trainer.loop import batch_norm
from trainer.model import models as model_lib


def _batches(real: np.ndarray, per_batch: int) -> tuple[tf.data.Dataset, int]:
    """Padded, weighted batches as the eval stream gives them: padding rows are
    noise of weight 0, which must not count."""
    rows = -(-len(real) // per_batch) * per_batch
    noise = np.random.default_rng(9).random((rows - len(real), *real.shape[1:]), np.float32)
    images = np.concatenate([real, noise * 50.0])
    weights = np.r_[np.ones(len(real)), np.zeros(rows - len(real))].astype(np.float32)
    ds = tf.data.Dataset.from_tensor_slices({contract.IMAGE_KEY: images, WEIGHT_KEY: weights})
    return ds.batch(per_batch), rows // per_batch


@pytest.mark.parametrize("virtual_batch_size", [0, 4])
def test_each_layer_gets_the_statistics_of_its_inputs(virtual_batch_size):
    tf.keras.utils.set_random_seed(3)
    model = model_lib.build_model("convnet_bn", augment=True,
                                  bn_virtual_batch_size=virtual_batch_size)
    layers = batch_norm.batch_norm_layers(model)
    assert len(layers) == 4
    for layer in layers:  # stale running averages, far from the truth
        layer.moving_mean.assign(tf.fill(layer.moving_mean.shape, 7.0))
        layer.moving_variance.assign(tf.fill(layer.moving_variance.shape, 0.01))
    real = np.random.default_rng(0).random((45, *contract.IMAGE_SHAPE), np.float32)
    dataset, steps = _batches(real, per_batch=16)
    batch_norm.Recalibrator(tf.distribute.get_strategy(), model, dataset, steps)()
    for layer in layers:
        x = tf.keras.Model(model.inputs, layer.input)(real, training=False).numpy()
        x = x.reshape(-1, x.shape[-1]).astype(np.float64)
        mean, variance = (v.numpy().reshape(-1)
                          for v in (layer.moving_mean, layer.moving_variance))
        np.testing.assert_allclose(mean, x.mean(0), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(variance, x.var(0), rtol=1e-3, atol=1e-5)


def test_a_model_without_batch_norm_has_nothing_to_recalibrate():
    assert batch_norm.batch_norm_layers(model_lib.build_model("convnet")) == []


@pytest.mark.parametrize("examples, batch, per_pass, steps", [
    (10_000, 128, 79, 79),     # the whole split is smaller than the sample
    (10_000, 128, 391, 79),    # 79 batches cover 10,000
    (10_000, 1024, 49, 10),
    (1, 1024, 4, 1),
])
def test_the_sample_is_whole_global_steps_within_one_pass(examples, batch, per_pass, steps):
    assert batch_norm.recalibration_steps(examples, batch, per_pass) == steps


def _ghost_normalized(x: np.ndarray, virtual_batch_size: int, epsilon: float) -> np.ndarray:
    """Batch normalization (scale 1, offset 0) of each ghost batch of ``x`` by its
    own statistics; Keras makes ghost batch g of the rows g, g + n, g + 2n, ...
    (n = batch // virtual_batch_size)."""
    groups = x.reshape(virtual_batch_size, -1, *x.shape[1:]).astype(np.float64)
    axes = (0, *range(2, groups.ndim - 1))
    mean = groups.mean(axes, keepdims=True)
    variance = groups.var(axes, keepdims=True)
    return ((groups - mean) / np.sqrt(variance + epsilon)).reshape(x.shape)


def test_ghost_batch_norm_normalizes_each_group_by_its_own_statistics():
    """``--bn_virtual_batch_size`` reaches every batch-norm layer of convnet_bn:
    in training a layer normalizes groups of that many rows, at inference it
    uses its moving statistics whatever the batch."""
    tf.keras.utils.set_random_seed(5)
    model = model_lib.build_model("convnet_bn", bn_virtual_batch_size=2)
    layers = batch_norm.batch_norm_layers(model)
    assert [l.virtual_batch_size for l in layers] == [2, 2, 2, 2]
    layer = layers[0]
    x = np.random.default_rng(1).normal(3.0, 2.0, (8, 6, 6, 32)).astype(np.float32)
    x[1::4] += 10.0  # rows 1 and 5: the ghost batch of 2 they form is shifted
    got = layer(x, training=True).numpy()
    np.testing.assert_allclose(got, _ghost_normalized(x, 2, layer.epsilon), atol=2e-3)
    whole = batch_norm.batch_norm_layers(model_lib.build_model("convnet_bn"))[0]
    assert not np.allclose(whole(x, training=True).numpy(), got, atol=1e-1)
    single = layer(x[:1], training=False).numpy()  # a batch of one at inference
    np.testing.assert_allclose(single, layer(x, training=False).numpy()[:1], atol=1e-5)
