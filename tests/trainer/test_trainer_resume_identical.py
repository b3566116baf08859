"""Resuming is bit-identical for the recipes' models too: convnet and the
presets' convnet_bn (dropout, augmentation, batch normalization and its
recalibration after the last step), stopped after one epoch and resumed, end
with the weights and optimizer state of an uninterrupted run, in both loops.

Dropout draws its masks from the step (`trainer.model.layers`), the
augmentation from a generator the checkpoint holds; Keras' own dropout kept
its random state in TensorFlow's kernels, which no checkpoint holds.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.trainer.trainer_runs import final_variables, run
from tests.trainer_data import read_metrics

# The presets' augmentation; a constant rate, so that --epochs may grow.
RECIPE = ("--augment", "--seed=1", "--lr_schedule=constant", "--steps_per_execution=2",
          "--bn_recalibration_examples=24")


# convnet_bn: batch normalization's moving statistics are variables the
# checkpoint holds too.
@pytest.mark.parametrize("loop,model", [("keras", "convnet"), ("custom", "convnet"),
                                        ("keras", "convnet_bn"), ("custom", "convnet_bn")])
def test_the_recipe_resumes_bit_identically(trainer_dataset, tmp_path, loop, model):
    data = trainer_dataset(num_train=64, num_test=16, train_shards=2, test_shards=1)
    flags = (*RECIPE, f"--model={model}")
    whole, resumed = str(tmp_path / "whole"), str(tmp_path / "resumed")
    assert run(data, whole, *flags, f"--loop={loop}", "--epochs=2") == 0
    assert run(data, resumed, *flags, f"--loop={loop}", "--epochs=1") == 0
    assert run(data, resumed, *flags, f"--loop={loop}", "--epochs=2") == 0
    assert read_metrics(resumed)["resumed_from_step"] == 8
    want, got = final_variables(whole), final_variables(resumed)
    assert sorted(got) == sorted(want) and len(want) > 10
    different = [name for name in want if not np.array_equal(got[name], want[name])]
    assert different == []
