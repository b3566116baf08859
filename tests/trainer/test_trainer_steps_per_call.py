"""Steps per call change how many steps one `tf.function` call runs, not what
they compute: a run at ``--steps_per_execution=1`` and the same run at 3
(which does not divide an epoch of 8 steps) end with the same weights and
optimizer state, in both loops, for the presets' model with augmentation,
dropout and batch normalization. The `tpu` preset's search relies on it
(docs/benchmarks.md, "The tpu preset's search"): the preset differs from
`cpu` in 50 steps per call too, and only its bfloat16 and ``--cache`` are
looked at as causes.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.trainer.trainer_runs import final_variables, run
from tests.trainer_data import read_metrics

RECIPE = ("--augment", "--seed=1", "--model=convnet_bn", "--epochs=2",
          "--bn_recalibration_examples=24")


@pytest.mark.parametrize("loop", ["keras", "custom"])
def test_steps_per_call_leave_the_numbers_as_they_are(trainer_dataset, tmp_path, loop):
    data = trainer_dataset(num_train=64, num_test=16, train_shards=2, test_shards=1)
    one, three = str(tmp_path / "one"), str(tmp_path / "three")
    assert run(data, one, *RECIPE, f"--loop={loop}", "--steps_per_execution=1") == 0
    assert run(data, three, *RECIPE, f"--loop={loop}", "--steps_per_execution=3") == 0
    assert read_metrics(three)["steps_per_epoch"] == 8
    want, got = final_variables(one), final_variables(three)
    assert sorted(got) == sorted(want) and len(want) > 10
    assert [name for name in want if not np.array_equal(got[name], want[name])] == []
