"""The models (`trainer.model.models`): architectures and the bfloat16 policy."""

from __future__ import annotations

import pytest
import tensorflow as tf
import tf_keras as keras

from trainer.errors import TrainerError
from trainer.model import models as model_lib


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
