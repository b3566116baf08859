"""The optimizers (`trainer.model.optimizer`): LAMB against its definition,
and in a run that stops and resumes."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tests.trainer.trainer_runs import final_variables, run
from tests.trainer_data import read_metrics
from trainer.errors import TrainerError
from trainer.model import optimizer as optimizer_lib

B1, B2, EPS = 0.9, 0.999, 1e-6


def _lamb_reference(w, grads, lr):
    """LAMB's Algorithm 2 (no weight decay), written out in numpy; vectors
    take Adam's step."""
    w, m, v = w.astype(np.float64), np.zeros_like(w, np.float64), np.zeros_like(w, np.float64)
    for t, g in enumerate(grads, start=1):
        m = B1 * m + (1 - B1) * g
        v = B2 * v + (1 - B2) * g * g
        r = (m / (1 - B1 ** t)) / (np.sqrt(v / (1 - B2 ** t)) + EPS)
        trust = np.linalg.norm(w) / np.linalg.norm(r) if w.ndim > 1 else 1.0
        w = w - lr * trust * r
    return w


def test_lamb_follows_its_definition():
    rng = np.random.default_rng(0)
    start = {"kernel": rng.normal(size=(4, 3)), "bias": rng.normal(size=3)}
    grads = {k: [rng.normal(size=x.shape) for _ in range(5)] for k, x in start.items()}
    variables = {k: tf.Variable(x.astype(np.float32)) for k, x in start.items()}
    lamb = optimizer_lib.Lamb(0.05, epsilon=EPS)
    for step in range(5):
        lamb.apply_gradients((tf.constant(grads[k][step], tf.float32), variables[k])
                             for k in start)
    for k, x in start.items():
        np.testing.assert_allclose(variables[k].numpy(), _lamb_reference(x, grads[k], 0.05),
                                   rtol=2e-5, atol=1e-6)


def test_every_matrix_moves_by_the_learning_rate_times_its_norm():
    rng = np.random.default_rng(1)
    for scale in (1e-3, 1.0, 100.0):
        w = tf.Variable(rng.normal(size=(8, 8)).astype(np.float32) * scale)
        before = w.numpy()
        optimizer_lib.Lamb(0.01).apply_gradients(
            [(tf.constant(rng.normal(size=(8, 8)) * 1e3, tf.float32), w)])
        moved = np.linalg.norm(w.numpy() - before) / np.linalg.norm(before)
        assert moved == pytest.approx(0.01, rel=1e-4)


def test_the_optimizer_is_chosen_by_name():
    lamb = optimizer_lib.make_optimizer(0.01, "cosine", 100, 10, "lamb")
    assert isinstance(lamb, optimizer_lib.Lamb)
    assert float(lamb.learning_rate) == 0.0  # step 0 of the warmup
    assert type(optimizer_lib.make_optimizer(0.01, "constant", 100, 0)).__name__ == "Adam"
    with pytest.raises(TrainerError, match="unknown --optimizer 'sgd'"):
        optimizer_lib.make_optimizer(0.01, "constant", 100, 0, "sgd")


@pytest.mark.parametrize("loop", ["keras", "custom"])
def test_a_lamb_run_resumes_bit_identically(trainer_dataset, tmp_path, loop):
    """Its moments are checkpointed and restored: a run stopped after one
    epoch and resumed ends as the uninterrupted one, optimizer state included."""
    data = trainer_dataset(num_train=64, num_test=16, train_shards=2, test_shards=1)
    flags = ("--optimizer=lamb", "--learning_rate=0.01", "--label_smoothing=0.1",
             "--seed=1", "--steps_per_execution=2", f"--loop={loop}")
    whole, resumed = str(tmp_path / "whole"), str(tmp_path / "resumed")
    assert run(data, whole, *flags, "--epochs=2") == 0
    assert run(data, resumed, *flags, "--epochs=1") == 0
    assert run(data, resumed, *flags, "--epochs=2") == 0
    assert read_metrics(resumed)["resumed_from_step"] == 8
    want, got = final_variables(whole), final_variables(resumed)
    # The small model's 10 weights: a first and a second moment each.
    moments = [name for name in want if name.startswith("optimizer/_variables/")]
    assert sorted(got) == sorted(want) and len(moments) >= 20
    assert [name for name in want if not np.array_equal(got[name], want[name])] == []
    h = read_metrics(whole)["history"]
    assert h["train_loss"][-1] < h["train_loss"][0]
