"""Small pieces: XLA compilation of the step, precision policy, strategies, imports."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from tests import trainer_data
from tests.helpers import REPO
from trainer import custom_loop, data, model as model_lib
from trainer import strategy as strategy_lib
from trainer.config import TrainConfig
from trainer.errors import TrainerError


def test_train_step_compiles_with_xla_on_cpu():
    """jit_compile=True: the TPU-safety check that runs without a TPU."""
    out = f"ram://xla-{uuid.uuid4().hex}"
    trainer_data.write_dataset(out, num_train=64, num_test=8)
    files = data.split_files(out, data.load_manifest(out), "train")
    ds = data.train_dataset(files, 16, tf.distribute.InputContext())
    strategy = tf.distribute.get_strategy()
    config = TrainConfig(data=out, model_dir="-", global_batch_size=16,
                         steps_per_execution=3, jit_compile=True)
    loop = custom_loop.CustomLoop(config, strategy, *model_lib.build(config, strategy, 6))
    batch = next(iter(ds))
    hlo = loop.replica_step.experimental_get_compiler_ir(batch)(stage="hlo")
    assert hlo.startswith("HloModule")
    iterator = iter(strategy.experimental_distribute_dataset(ds))
    loop.train(iterator, 6)  # twice the multi-step function, XLA step inside
    assert int(loop.optimizer.iterations.numpy()) == 6
    assert np.isfinite(loop.train_loss.result().numpy())


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


def test_strategies_off_a_tpu(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("TPU_NAME", raising=False)
    assert strategy_lib.make_strategy("default") is tf.distribute.get_strategy()
    auto = strategy_lib.make_strategy("auto")
    assert auto.num_replicas_in_sync == 1 and strategy_lib.is_chief(auto)
    with pytest.raises(TrainerError, match="needs TF_CONFIG"):
        strategy_lib.make_strategy("multi_worker")
    monkeypatch.setenv("TF_CONFIG", "{not json")
    with pytest.raises(TrainerError, match="TF_CONFIG is not valid JSON"):
        strategy_lib.make_strategy("multi_worker")


def test_eval_steps_arithmetic():
    # 37 examples in one pipeline, 2 replicas x 4: 5 steps (40 slots, 3 padding).
    assert data.eval_steps([19, 18], 8, 2, 1) == 5
    # Two pipelines, files 0+2 (25) vs 1 (12): the larger sets the count.
    assert data.pipeline_example_counts([13, 12, 12], 2) == [25, 12]
    assert data.eval_steps([13, 12, 12], 8, 4, 2) == 7
    # Fewer files than pipelines: records dealt round robin.
    assert data.pipeline_example_counts([37], 2) == [19, 18]


def test_importing_the_trainer_never_imports_beam_or_the_pipeline():
    code = textwrap.dedent("""
        import importlib, pkgutil, sys
        import trainer
        for module in pkgutil.iter_modules(trainer.__path__):
            importlib.import_module("trainer." + module.name)
        import tensorflow as tf, tf_keras
        assert "apache_beam" not in sys.modules, "apache_beam imported"
        leaked = sorted(m for m in sys.modules if m.split(".")[0] == "pipeline")
        assert not leaked, f"the trainer imported {leaked}"
        assert "mnist_contract" in sys.modules
        assert tf.keras.Model is tf_keras.Model, "tf.keras is not tf-keras"
        print("ok")
    """)
    env = {"PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "2"}  # no TF_USE_LEGACY_KERAS
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_the_pipeline_never_imports_the_trainer():
    code = textwrap.dedent("""
        import importlib, pkgutil, sys
        import pipeline
        for module in pkgutil.iter_modules(pipeline.__path__):
            importlib.import_module("pipeline." + module.name)
        leaked = sorted(m for m in sys.modules if m.split(".")[0] == "trainer")
        assert not leaked, f"the pipeline imported {leaked}"
        print("ok")
    """)
    env = {"PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_public_strategy_names(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert strategy_lib.public_name(tf.distribute.get_strategy()) == "default"
    assert strategy_lib.public_name(tf.distribute.MirroredStrategy()) == "MirroredStrategy"
    assert strategy_lib.num_hosts(tf.distribute.get_strategy()) == 1
