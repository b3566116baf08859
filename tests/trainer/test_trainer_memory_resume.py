"""The in-memory input (``--cache``) under MirroredStrategy with 2 CPU replicas.

In one fresh process (the CPU is split into two logical devices before
TensorFlow starts): the distributed stream's epochs, as the replicas receive
them, hold every example once; and in both loops a run stopped after its
first epoch and resumed ends with the weights and optimizer state of an
uninterrupted run, bit for bit.

44 examples at global batch 8 (4 per replica): an epoch of the trainer is 5
steps (40 examples), an epoch of the data 5.5 steps, so the resume at step
5 enters the data's first epoch at example 40 and its next batch straddles
the epoch's end.
"""

from __future__ import annotations

import textwrap

import pytest

from tests.helpers import run_results_script

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent(r'''
    import json, logging, sys
    import trainer
    from trainer import strategy as strategy_lib
    strategy_lib.split_cpu(2)  # before anything else touches TensorFlow

    import numpy as np
    import tensorflow as tf
    from tests import trainer_data
    from tests.trainer.trainer_runs import final_variables
    from trainer.config import TrainConfig
    from trainer.data import input_pipeline, splits
    from trainer.train import train_and_evaluate

    tmp = sys.argv[1]
    data = tmp + "/data"
    trainer_data.write_dataset(data, num_train=44, num_test=12, train_shards=2,
                               test_shards=1)

    class Lines(logging.Handler):
        lines = []

        def emit(self, record):
            self.lines.append(record.getMessage())
    logger = logging.getLogger("trainer.data.input_pipeline")
    logger.addHandler(Lines())
    logger.setLevel(logging.INFO)

    def config(**kw):
        return TrainConfig(data=data, cache=True, seed=1, global_batch_size=8,
                           steps_per_execution=2, cpu_replicas=2, verbose=0,
                           log_every=1000, **kw)

    results = {}
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    files = splits.split_files(data, splits.load_manifest(data), "train")
    stream = iter(input_pipeline.train_input(strategy, files, config(model_dir="-")))
    seen = []
    for _ in range(33):  # 264 examples: six epochs of the data
        per_replica = strategy.experimental_local_results(next(stream)["index"])
        seen.extend(int(i) for part in per_replica for i in part.numpy())
    results["epochs"] = [seen[e * 44:(e + 1) * 44] for e in range(6)]
    results["replicas"] = strategy.num_replicas_in_sync

    for loop in ("keras", "custom"):
        whole, resumed = f"{tmp}/{loop}-whole", f"{tmp}/{loop}-resumed"
        train_and_evaluate(config(model_dir=whole, loop=loop, epochs=3))
        train_and_evaluate(config(model_dir=resumed, loop=loop, epochs=1))
        m = train_and_evaluate(config(model_dir=resumed, loop=loop, epochs=3))
        want, got = final_variables(whole), final_variables(resumed)
        results[loop] = {
            "replicas": m["replicas"], "resumed_from_step": m["resumed_from_step"],
            "train_steps": m["train_steps"], "names_match": sorted(want) == sorted(got),
            "variables": len(want),
            "different": [k for k in want if not np.array_equal(want[k], got[k])]}
    results["log"] = Lines.lines
    print("RESULTS " + json.dumps(results))
''')


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out, _ = run_results_script(SCRIPT, tmp_path_factory.mktemp("memory"), timeout=600)
    return out


def test_two_replicas_receive_whole_epochs(results):
    assert results["replicas"] == 2
    epochs = results["epochs"]
    assert all(sorted(e) == list(range(44)) for e in epochs)
    assert len({tuple(e) for e in epochs}) == 6  # a new permutation each epoch


@pytest.mark.parametrize("loop", ["keras", "custom"])
def test_a_resumed_run_is_bit_identical_on_two_replicas(results, loop):
    got = results[loop]
    assert got["replicas"] == 2
    assert got["resumed_from_step"] == 5 and got["train_steps"] == 15
    assert got["names_match"] and got["variables"] > 10
    assert got["different"] == []


def test_the_runs_took_the_in_memory_path_and_resumed_inside_an_epoch(results):
    log = results["log"]
    assert any("train" in m and "decoded once" in m for m in log), log
    assert not any("streamed from the files" in m for m in log), log
    # Step 5: 10 batches of 4 for the one pipeline of two replicas.
    resumes = [m for m in log if "resuming the seeded in-memory input" in m]
    line = ("split 'train': resuming the seeded in-memory input at step 5: epoch 0 of "
            "the share, from its example 40")
    assert resumes == [line] * 2, log
