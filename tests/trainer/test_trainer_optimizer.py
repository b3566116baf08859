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


def _lamb_reference(w, grads, lr, decay=0.0):
    """LAMB's Algorithm 2, written out in numpy; vectors take Adam's step,
    undecayed."""
    w, m, v = w.astype(np.float64), np.zeros_like(w, np.float64), np.zeros_like(w, np.float64)
    for t, g in enumerate(grads, start=1):
        m = B1 * m + (1 - B1) * g
        v = B2 * v + (1 - B2) * g * g
        r = (m / (1 - B1 ** t)) / (np.sqrt(v / (1 - B2 ** t)) + EPS)
        if w.ndim > 1:
            r = r + decay * w
        trust = np.linalg.norm(w) / np.linalg.norm(r) if w.ndim > 1 else 1.0
        w = w - lr * trust * r
    return w


def _lars_reference(w, grads, lr, decay=0.0, momentum=0.9, eta=1e-3):
    """LARS as the MLPerf ResNet references define it, in numpy; vectors take
    plain momentum SGD, undecayed."""
    w, v = w.astype(np.float64), np.zeros_like(w, np.float64)
    for g in grads:
        ratio = 1.0
        if w.ndim > 1:
            g = g + decay * w
            ratio = eta * np.linalg.norm(w) / np.linalg.norm(g)
        v = momentum * v + lr * ratio * g
        w = w - v
    return w


@pytest.mark.parametrize("name, rate, reference, seed", [
    ("lamb", 0.05, _lamb_reference, 0), ("lars", 2.0, _lars_reference, 2)])
@pytest.mark.parametrize("decay", [0.0, 0.5])
def test_lamb_and_lars_follow_their_definitions(name, rate, reference, seed, decay):
    rng = np.random.default_rng(seed)
    start = {"kernel": rng.normal(size=(4, 3)), "bias": rng.normal(size=3)}
    grads = {k: [rng.normal(size=x.shape) for _ in range(5)] for k, x in start.items()}
    variables = {k: tf.Variable(x.astype(np.float32)) for k, x in start.items()}
    optimizer = optimizer_lib.make_optimizer(rate, "constant", 5, 0, name, weight_decay=decay)
    assert type(optimizer).__name__ == name.capitalize()
    optimizer_lib.build_optimizer(optimizer, list(variables.values()))
    for step in range(5):
        optimizer.apply_gradients((tf.constant(grads[k][step], tf.float32), variables[k])
                                  for k in start)
    for k, x in start.items():
        np.testing.assert_allclose(variables[k].numpy(), reference(x, grads[k], rate, decay),
                                   rtol=2e-5, atol=1e-6)


def test_adamw_decays_kernels_and_leaves_vectors():
    """With zero gradients Adam's step is 0, so what moves is the decay alone:
    each step multiplies a kernel by 1 - rate × decay; vectors stay."""
    kernel = tf.Variable(np.full((3, 3, 1, 2), 2.0, np.float32))
    scale = tf.Variable(np.full((2,), 2.0, np.float32))
    adamw = optimizer_lib.make_optimizer(0.1, "constant", 3, 0, "adam", weight_decay=0.5)
    assert type(adamw).__name__ == "AdamW"
    optimizer_lib.build_optimizer(adamw, [kernel, scale])
    for _ in range(3):
        adamw.apply_gradients([(tf.zeros_like(kernel), kernel), (tf.zeros_like(scale), scale)])
    np.testing.assert_allclose(kernel.numpy(), 2.0 * (1 - 0.1 * 0.5) ** 3, rtol=1e-6)
    np.testing.assert_array_equal(scale.numpy(), 2.0)


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
    with pytest.raises(TrainerError, match="bad --weight_decay -1"):
        optimizer_lib.make_optimizer(0.01, "constant", 100, 0, weight_decay=-1)
    with pytest.raises(TrainerError, match="unknown --optimizer 'sgd'"):
        optimizer_lib.make_optimizer(0.01, "constant", 100, 0, "sgd")


@pytest.mark.parametrize("name, loop", [("lamb", "keras"), ("lamb", "custom"),
                                        ("lars", "custom")])
def test_a_lamb_or_lars_run_resumes_bit_identically(trainer_dataset, tmp_path, name, loop):
    """Its moments are checkpointed and restored: a run stopped after one
    epoch and resumed ends as the uninterrupted one, optimizer state included."""
    data = trainer_dataset(num_train=64, num_test=16, train_shards=2, test_shards=1)
    flags = (f"--optimizer={name}", "--learning_rate=0.01", "--label_smoothing=0.1",
             "--weight_decay=0.01",
             "--seed=1", "--steps_per_execution=2", f"--loop={loop}")
    whole, resumed = str(tmp_path / "whole"), str(tmp_path / "resumed")
    assert run(data, whole, *flags, "--epochs=2") == 0
    assert run(data, resumed, *flags, "--epochs=1") == 0
    assert run(data, resumed, *flags, "--epochs=2") == 0
    assert read_metrics(resumed)["resumed_from_step"] == 8
    want, got = final_variables(whole), final_variables(resumed)
    # The small model's 10 weights: LAMB's first and second moments, LARS's momentum.
    moments = [n for n in want if n.startswith("optimizer/_variables/")]
    assert sorted(got) == sorted(want) and len(moments) >= (20 if name == "lamb" else 10)
    assert [n for n in want if not np.array_equal(got[n], want[n])] == []
    h = read_metrics(whole)["history"]
    assert h["train_loss"][-1] < h["train_loss"][0]


@pytest.mark.parametrize("loop", ["keras", "custom"])
def test_both_loops_decay_the_kernels(trainer_dataset, tmp_path, loop):
    """``--weight_decay`` reaches the optimizer each loop steps with: 8 steps
    at rate 1e-3 and decay 100 leave every kernel at about 0.9⁸ ≈ 0.43 of
    where the same run without decay ends."""
    data = trainer_dataset(num_train=64, num_test=16, train_shards=1, test_shards=1)
    flags = ("--seed=1", "--epochs=1", f"--loop={loop}")
    plain, decayed = str(tmp_path / "plain"), str(tmp_path / "decayed")
    assert run(data, plain, *flags) == 0
    assert run(data, decayed, *flags, "--weight_decay=100") == 0
    want, got = final_variables(plain), final_variables(decayed)
    kernels = [n for n in want if "kernel" in n and not n.startswith("optimizer")]
    assert kernels
    for name in kernels:
        ratio = np.linalg.norm(got[name]) / np.linalg.norm(want[name])
        assert ratio == pytest.approx(0.9 ** 8, rel=0.05), name


@pytest.mark.parametrize("warmup_epochs, warned, at_half", [
    (0.5, False, 7.5e-4),  # 4 warmup steps, then a third of the cosine decay
    (2.0, False, 5e-4),  # the whole run: the peak at its last step
    (3.0, True, 5e-4),   # longer than the run: cut to it, and said so
])
def test_a_warmup_longer_than_the_run_is_cut_to_it_with_a_warning(caplog, warmup_epochs,
                                                                 warned, at_half):
    from trainer.config import TrainConfig
    from trainer.model import models
    from trainer.run import plan as plan_lib
    config = TrainConfig(data="d", model_dir="m", epochs=2, lr_schedule="cosine",
                         warmup_epochs=warmup_epochs)
    warmup = plan_lib.warmup_steps(config, 16)
    models.warn_long_warmup(plan_lib.settings_of(plan_lib.ModelSpec, config), warmup, 16)
    rate = optimizer_lib.learning_rate_schedule(1e-3, "cosine", 16, warmup)
    assert float(rate(8)) == pytest.approx(at_half)
    if warmup_epochs >= 2:
        assert float(rate(16)) == pytest.approx(1e-3)
    warnings = [r.getMessage() for r in caplog.records if "longer than the run" in r.getMessage()]
    assert warnings == ([f"--warmup_epochs=3 (24 steps) is longer than the run's 16 steps: the "
                         "warmup is cut to the run, and the learning rate reaches "
                         "--learning_rate=0.001 only at its last step"] if warned else [])
