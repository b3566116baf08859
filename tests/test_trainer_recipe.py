"""The CPU recipe (convnet + augmentation + warmup/cosine schedule) on real digits,
under MirroredStrategy with 2 logical CPU replicas and steps_per_execution > 1,
in both loops; and its export's accuracy on raw pixels equals the trainer's.

A subprocess, because the CPU can only be split into logical devices before
TensorFlow initializes (see tests/test_trainer_distributed.py).
"""

from __future__ import annotations

import textwrap

import pytest

from tests.conftest import run_results_script

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent(r'''
    import json, sys
    import trainer
    from trainer import strategy as strategy_lib
    strategy_lib.split_cpu(2)

    import numpy as np
    import tf_keras as keras
    from tests import trainer_data
    from tests.conftest import real_digits
    from trainer.config import TrainConfig
    from trainer.train import train_and_evaluate

    tmp = sys.argv[1]
    train, test = real_digits(640), real_digits(150, offset=3)
    trainer_data.write_dataset(tmp + "/data", arrays={"train": train, "test": test},
                               train_shards=4, test_shards=2)
    results = {}
    for loop in ("keras", "custom"):
        model_dir = f"{tmp}/{loop}"
        m = train_and_evaluate(TrainConfig(
            data=tmp + "/data", model_dir=model_dir, loop=loop, model="convnet",
            augment=True, lr_schedule="cosine", warmup_steps=10, learning_rate=2e-3,
            epochs=5, global_batch_size=32, steps_per_execution=5, cpu_replicas=2,
            verbose=0, seed=0, log_every=20))
        export = keras.models.load_model(model_dir + "/export")  # no custom objects
        classes = export.predict(test[0], verbose=0).argmax(-1)  # raw uint8 [N,28,28]
        m["export_correct"] = int((classes == test[1]).sum())
        results[loop] = m
    print("RESULTS " + json.dumps(results))
''')


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("recipe")
    return run_results_script(SCRIPT, tmp, timeout=600)[0]


@pytest.mark.parametrize("loop", ["keras", "custom"])
def test_recipe_learns_real_digits_on_two_replicas(results, loop):
    m = results[loop]
    assert m["strategy"] == "MirroredStrategy" and m["replicas"] == 2
    assert m["train_steps"] == 5 * (640 // 32)
    h = m["history"]
    assert h["train_loss"][-1] < 0.6 * h["train_loss"][0]
    assert m["test_examples"] == 150
    assert m["test_accuracy"] > 0.75  # 640 real digits, 100 steps; chance is 0.1


@pytest.mark.parametrize("loop", ["keras", "custom"])
def test_export_accuracy_on_raw_pixels_equals_the_trainers(results, loop):
    m = results[loop]
    assert m["export_correct"] == round(m["test_accuracy"] * m["test_examples"])
