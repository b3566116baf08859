"""The models (`trainer.model.models`): architectures and the bfloat16 policy."""

from __future__ import annotations

import pytest
import tensorflow as tf
import tf_keras as keras

from trainer.config import TrainConfig
from trainer.errors import TrainerError
from trainer.model import models as model_lib
from trainer.model.layers import StepDropout


def test_models():
    guide = model_lib.build_model("guide")
    assert [l.__class__.__name__ for l in guide.layers] == [
        "Conv2D", "Conv2D", "Flatten", "Dense", "Dense", "Dense"]
    assert [getattr(l, "filters", None) or getattr(l, "units", None)
            for l in guide.layers] == [256, 256, None, 256, 128, 10]
    assert all(l.kernel_regularizer.l2 == pytest.approx(1e-5)
               for l in guide.layers if hasattr(l, "kernel_regularizer"))
    small = model_lib.build_model("small")
    assert small.count_params() < guide.count_params() / 20
    with pytest.raises(TrainerError):
        model_lib.build_model("huge")


@pytest.mark.parametrize("name", ["convnet", "convnet_bn"])
@pytest.mark.parametrize("flags, rate", [({}, 0.4), ({"dropout": 0.25}, 0.25)])
def test_dropout_flag_sets_both_dropout_layers(name, flags, rate):
    """``--dropout`` reaches the model the trainer builds (`build`); 0.4 by default."""
    config = TrainConfig(data="d", model_dir="m", model=name, **flags)
    model, _ = model_lib.build(config, tf.distribute.get_strategy(), total_steps=10)
    assert [l.rate for l in model.layers if isinstance(l, StepDropout)] == [rate, rate]


def test_bfloat16_policy_keeps_logits_float32():
    model_lib.set_precision("bfloat16")
    try:
        model = model_lib.build_model("small")
    finally:
        model_lib.set_precision("none")
    assert model.layers[0].compute_dtype == "bfloat16"
    assert model.layers[0].variable_dtype == "float32"
    assert model(tf.zeros([2, 28, 28, 1])).dtype == tf.float32
    assert keras.mixed_precision.global_policy().name == "float32"
