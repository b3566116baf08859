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


def test_each_layer_gets_the_statistics_of_its_inputs():
    tf.keras.utils.set_random_seed(3)
    model = model_lib.build_model("convnet_bn", augment=True)
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
        np.testing.assert_allclose(layer.moving_mean.numpy(), x.mean(0), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(layer.moving_variance.numpy(), x.var(0), rtol=1e-3,
                                   atol=1e-5)


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
