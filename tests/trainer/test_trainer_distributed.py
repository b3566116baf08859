"""Both loops under MirroredStrategy with 2 CPU replicas, in one fresh process.

The CPU can only be split into logical devices before TensorFlow initializes
its runtime, which the test process has long done; so a subprocess runs all
two-replica scenarios (sharing one TensorFlow start-up) and reports JSON.
Scenarios write their data and model_dir on ``ram://`` or on disk.

What is checked: training with steps_per_execution > 1 (Keras and custom)
and single-step (custom) learns (loss falls, accuracy rises); evaluation
covers all 37 test examples of a split that 8 does not divide, and its
metrics equal those computed directly from the exported model on the raw
arrays; both loops resume at the saved step; outputs land in model_dir.
Then, in the same process (so a second model under the same devices is
covered too), the CPU recipe (convnet_bn + augmentation + warmup/cosine
schedule) learns real digits in both loops, and its export's accuracy on raw
pixels equals the trainer's; so does the tpu preset, in bfloat16 with ghost
batch normalization, and its export serves a single digit.
"""

from __future__ import annotations

import textwrap

import pytest

from tests.helpers import run_results_script

# Hang bounds, not speed bars: the module's trainings (the `results` fixture,
# charged to the first test) took 77-248 s in the suite runs recorded in
# docs/benchmarks.md (The test suite); the bounds are over 10x that.
TRAININGS_BOUND_S = 2700
pytestmark = [pytest.mark.slow, pytest.mark.timeout(TRAININGS_BOUND_S + 300)]

SCRIPT = textwrap.dedent(r'''
    import json, sys
    import trainer
    from trainer import strategy as strategy_lib
    strategy_lib.split_cpu(2)  # before anything else touches TensorFlow

    import numpy as np
    import tensorflow as tf
    import tf_keras as keras
    from mnist_contract import join_path
    from tests import trainer_data
    from trainer.config import TrainConfig
    from trainer.run import outputs
    from trainer.train import train_and_evaluate

    tmp = sys.argv[1]
    NUM_TEST = 37
    for root in ("ram://dist-data", tmp + "/data"):
        trainer_data.write_dataset(root, num_train=512, num_test=NUM_TEST,
                                   train_shards=4, test_shards=2)
    test_images, test_labels = trainer_data.eval_arrays(NUM_TEST)

    def files_under(path):
        return sorted(f"{d[len(path):]}/{f}".lstrip("/")
                      for d, _, fs in tf.io.gfile.walk(path) for f in fs)

    def direct_metrics(model_dir):
        """Metrics of the exported model on the raw test arrays, no padding involved."""
        model = keras.models.load_model(join_path(model_dir, outputs.EXPORT),
                                        compile=False)
        logits = model.predict(test_images, verbose=0)  # raw uint8: the export scales
        xent = keras.losses.sparse_categorical_crossentropy(
            test_labels, logits, from_logits=True).numpy()
        return {"loss": float(xent.mean()),
                "accuracy": float((logits.argmax(-1) == test_labels).mean())}

    def run(name, data, model_dir, **kw):
        cfg = dict(data=data, model_dir=model_dir, global_batch_size=8, epochs=3,
                   steps_per_epoch=16, cpu_replicas=2, verbose=2, log_every=8, seed=1,
                   learning_rate=3e-3)
        cfg.update(kw)
        callbacks = cfg.pop("callbacks", ())
        metrics = train_and_evaluate(TrainConfig(**cfg), callbacks=callbacks)
        return metrics

    results = {}

    def scenario(name, data, model_dir, **kw):
        m = run(name, data, model_dir, **kw)
        m["direct"] = direct_metrics(model_dir)
        m["files"] = files_under(model_dir)
        m["metrics_json"] = trainer_data.read_metrics(model_dir)
        results[name] = m

    scenario("keras", "ram://dist-data", "ram://dist-keras", loop="keras",
             steps_per_execution=5)
    scenario("custom_multi", tmp + "/data", tmp + "/custom_multi", loop="custom",
             steps_per_execution=5)
    scenario("custom_single", "ram://dist-data", tmp + "/custom_single", loop="custom",
             steps_per_execution=1)

    # Resume, custom loop: one epoch, then the same model_dir asked for three.
    first = run("r", tmp + "/data", tmp + "/resume_custom", loop="custom",
                steps_per_execution=4, epochs=1)
    second = run("r", tmp + "/data", tmp + "/resume_custom", loop="custom",
                 steps_per_execution=4, epochs=3)
    results["resume_custom"] = {"first": first, "second": second}

    # Resume, Keras: crash after the first epoch, then run again.
    class Crash(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            raise RuntimeError("simulated crash")
    crashed = None
    try:
        run("k", tmp + "/data", tmp + "/resume_keras", loop="keras",
            steps_per_execution=4, callbacks=[Crash()])
    except RuntimeError as e:
        crashed = str(e)
    second = run("k", tmp + "/data", tmp + "/resume_keras", loop="keras",
                 steps_per_execution=4)
    results["resume_keras"] = {"crashed": crashed, "second": second}

    # The CPU recipe's model on real digits, another model in the same process:
    # 100 steps, short enough that batch normalization's moving statistics
    # must have caught up for the evaluation to pass.
    from tests.helpers import real_digits
    train, test = real_digits(640), real_digits(150, offset=3)
    trainer_data.write_dataset(tmp + "/digits", arrays={"train": train, "test": test},
                               train_shards=4, test_shards=2)
    for loop in ("keras", "custom"):
        model_dir = f"{tmp}/recipe_{loop}"
        m = train_and_evaluate(TrainConfig(
            data=tmp + "/digits", model_dir=model_dir, loop=loop, model="convnet_bn",
            augment=True, lr_schedule="cosine", warmup_steps=10, learning_rate=2e-3,
            epochs=5, global_batch_size=32, steps_per_execution=5, cpu_replicas=2,
            verbose=0, seed=0, log_every=20))
        export = keras.models.load_model(model_dir + "/export")  # no custom objects
        classes = export.predict(test[0], verbose=0).argmax(-1)  # raw uint8 [N,28,28]
        m["export_correct"] = int((classes == test[1]).sum())
        results["recipe_" + loop] = m
    # The tpu preset (convnet_bn in bfloat16, in-memory input, batch-norm
    # recalibration) at a batch of 32 and a learning rate of 5e-3 on these
    # 640 digits, with ghost batches of 8 of each replica's 16.
    from trainer.config import from_preset
    m = train_and_evaluate(from_preset(
        "tpu", data=tmp + "/digits", model_dir=tmp + "/recipe_tpu", learning_rate=5e-3,
        epochs=5, global_batch_size=32, steps_per_execution=5, cpu_replicas=2, verbose=0,
        seed=0, log_every=20, bn_virtual_batch_size=8))
    export = keras.models.load_model(tmp + "/recipe_tpu/export")
    m["export_classes"] = export.predict(test[0], verbose=0).argmax(-1).tolist()
    m["export_correct"] = int((np.array(m["export_classes"]) == test[1]).sum())
    m["export_one"] = export.predict(test[0][:1], verbose=0).argmax(-1).tolist()
    m["export_dtypes"] = sorted({l.compute_dtype for l in export.layers if l.weights})
    m["export_ghost"] = sorted({str(l.virtual_batch_size) for l in export.submodules
                                if isinstance(l, keras.layers.BatchNormalization)})
    checkpoint = tf.train.latest_checkpoint(tmp + "/recipe_tpu/checkpoints")
    m["checkpoint_bn_shapes"] = sorted({tuple(shape) for name, shape in
                                        tf.train.list_variables(checkpoint)
                                        if "moving_mean" in name})
    results["recipe_tpu"] = m
    # The tpu preset exactly as it is (its batch, learning rate, warmup,
    # bfloat16 and steps per call), 3 epochs of 2,560 real digits: 20 steps
    # an epoch; every 6th of 3,072 digits is held out as the test split.
    digits, labels = real_digits(3072)
    held = np.arange(len(labels)) % 6 == 5
    train, test = (digits[~held], labels[~held]), (digits[held], labels[held])
    trainer_data.write_dataset(tmp + "/digits_2560", arrays={"train": train, "test": test},
                               train_shards=4, test_shards=2)
    results["preset_tpu"] = train_and_evaluate(from_preset(
        "tpu", data=tmp + "/digits_2560", model_dir=tmp + "/preset_tpu", epochs=3,
        cpu_replicas=2, verbose=0, seed=0))
    print("RESULTS " + json.dumps(results))
''')


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("distributed")
    out, stdout = run_results_script(SCRIPT, tmp, timeout=TRAININGS_BOUND_S)
    out["stdout"] = stdout
    return out


@pytest.mark.parametrize("name", ["keras", "custom_multi", "custom_single"])
def test_two_replicas_learn(results, name):
    m = results[name]
    assert m["strategy"] == "MirroredStrategy" and m["replicas"] == 2
    assert m["train_steps"] == 3 * 16 and m["train_examples"] == 3 * 16 * 8
    h = m["history"]
    assert len(h["train_loss"]) == 3
    assert h["train_loss"][-1] < 0.5 * h["train_loss"][0]
    assert h["train_accuracy"][-1] > h["train_accuracy"][0] + 0.2
    assert h["test_loss"][-1] < h["test_loss"][0]
    assert m["test_accuracy"] > 0.8  # chance is 0.1


@pytest.mark.parametrize("name", ["keras", "custom_multi", "custom_single"])
def test_eval_is_exact_on_non_divisible_split(results, name):
    m = results[name]
    assert m["test_examples"] == 37
    # Padded, masked, two-replica evaluation == plain evaluation of the export.
    assert m["test_loss"] == pytest.approx(m["direct"]["loss"], rel=1e-4, abs=1e-6)
    assert m["test_accuracy"] == pytest.approx(m["direct"]["accuracy"], abs=1e-6)
    assert m["history"]["test_loss"][-1] == pytest.approx(m["test_loss"], rel=1e-4)


@pytest.mark.parametrize("name", ["keras", "custom_multi", "custom_single"])
def test_outputs_in_model_dir(results, name):
    m = results[name]
    files = m["files"]
    assert "metrics.json" in files
    assert m["metrics_json"]["test_examples"] == 37
    assert "export/saved_model.pb" in files
    assert any(f.startswith("logs/train/") and "tfevents" in f for f in files)
    assert any(f.startswith("logs/validation/") and "tfevents" in f for f in files)
    assert "checkpoints/ckpt-48.index" in files  # the same naming in both loops
    assert not any(f.startswith("backup") for f in files)


def test_keras_progress_has_no_counting_metric(results):
    out = results["stdout"]
    assert " - loss: " in out and " - accuracy: " in out  # verbose=2: a line per epoch
    assert "examples:" not in out and "xent" not in out


def test_custom_loop_progress_lines(results):
    out = results["stdout"]
    assert "step 8/48 epoch 1/3 loss " in out and " examples/s" in out
    assert "epoch 3/3 test_loss " in out and "(37 examples)" in out


def test_custom_loop_resumes_at_saved_step(results):
    first, second = results["resume_custom"]["first"], results["resume_custom"]["second"]
    assert first["train_steps"] == 16 and first["resumed_from_step"] == 0
    assert second["resumed_from_step"] == 16
    assert second["train_steps"] == 48  # not 16 + 48: it continued
    # The whole run's history: epoch 1 (from the checkpoint), then 2 and 3.
    for key, values in second["history"].items():
        assert len(values) == 3 and values[0] == first["history"][key][0], key
    assert second["history"]["train_loss"][1] < first["history"]["train_loss"][0]
    assert "resuming at step 16/48" in results["stdout"]


def test_keras_loop_resumes_after_crash(results):
    r = results["resume_keras"]
    assert r["crashed"] == "simulated crash"
    second = r["second"]
    assert second["resumed_from_step"] == 16  # the checkpoint after epoch 1
    assert second["train_steps"] == 48
    assert [len(v) for v in second["history"].values()] == [3, 3, 3, 3]


@pytest.mark.parametrize("loop", ["keras", "custom"])
def test_recipe_learns_real_digits_on_two_replicas(results, loop):
    m = results["recipe_" + loop]
    assert m["strategy"] == "MirroredStrategy" and m["replicas"] == 2
    assert m["train_steps"] == 5 * (640 // 32)
    h = m["history"]
    assert h["train_loss"][-1] < 0.6 * h["train_loss"][0]
    assert m["test_examples"] == 150
    assert m["test_accuracy"] > 0.75  # 640 real digits, 100 steps; chance is 0.1


def test_the_tpu_preset_as_it_is_learns_in_bfloat16(results):
    """The preset's own batch, learning rate and warmup, in bfloat16 on CPU."""
    m = results["preset_tpu"]
    assert (m["preset"], m["replicas"], m["global_batch_size"]) == ("tpu", 2, 128)
    assert m["train_steps"] == 3 * (2560 // 128) and m["test_examples"] == 512
    assert m["history"]["train_loss"][-1] < 0.5 * m["history"]["train_loss"][0]
    assert m["test_accuracy"] > 0.85, m["history"]  # chance is 0.1


def test_the_tpu_preset_learns_in_bfloat16_on_two_replicas(results):
    m = results["recipe_tpu"]
    assert (m["preset"], m["replicas"], m["train_steps"]) == ("tpu", 2, 5 * (640 // 32))
    assert m["test_accuracy"] > 0.75  # chance is 0.1
    assert m["history"]["train_loss"][-1] < 0.6 * m["history"]["train_loss"][0]
    # bfloat16 sums in another order in the export's batches: a digit may flip.
    assert abs(m["export_correct"] - m["test_accuracy"] * m["test_examples"]) <= 2
    assert "bfloat16" in m["export_dtypes"]
    # Trained with ghost batches (Keras keeps their statistics as
    # [1, 1, 1, 1, channels]); exported as plain batch normalization, which
    # serves one digit at a time.
    assert m["checkpoint_bn_shapes"] == [[1, 1, 1, 1, 32], [1, 1, 1, 1, 64]]
    assert m["export_ghost"] == ["None"]
    assert m["export_one"] == [m["export_classes"][0]]
    # Its batch-norm statistics recomputed once, before the last evaluation
    # and the export: 10,000 examples asked, the 640 of one pass given (the
    # second line is the preset's own run, over its 2,560).
    recalibrated = [line.rsplit(" in ", 1)[0] for line in results["stdout"].splitlines()
                    if line.startswith("batch norm:")]
    assert recalibrated == ["batch norm: statistics of 4 layers recomputed over 640 "
                            "train examples", "batch norm: statistics of 4 layers "
                            "recomputed over 2560 train examples"]


@pytest.mark.parametrize("loop", ["keras", "custom"])
def test_export_accuracy_on_raw_pixels_equals_the_trainers(results, loop):
    m = results["recipe_" + loop]
    assert m["export_correct"] == round(m["test_accuracy"] * m["test_examples"])
