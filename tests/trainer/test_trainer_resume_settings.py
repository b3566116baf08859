"""Resuming with changed settings: refused with one line naming the flag, or
(more epochs) continued with truthful metrics."""

from __future__ import annotations


import pytest

from trainer.config import TrainConfig
from trainer.errors import TrainerError
from trainer.run import resume

# model_dir, trained: the shared fixtures.
from tests.trainer.trainer_runs import one_error, run
from tests.trainer_data import read_metrics

LOOP = ["--loop=custom", "--steps_per_epoch=4"]


@pytest.mark.parametrize("flag, saved", [
    ("--global_batch_size=16", "8"),
    ("--augment", "false"),
    ("--lr_schedule=cosine", "constant"),
    ("--learning_rate=0.01", "0.001"),
    ("--warmup_steps=3", "0"),
    ("--warmup_epochs=0.5", "0.0"),
    ("--label_smoothing=0.1", "0.0"),
    ("--weight_decay=0.05", "0.0"),
    ("--dropout=0.25", "0.4"),
    ("--optimizer=lamb", "adam"),
    ("--steps_per_epoch=5", "4"),
])
def test_a_setting_that_defines_the_run_cannot_change(trained, model_dir, capsys, flag,
                                                       saved):
    capsys.readouterr()
    flags = [f for f in LOOP if f.split("=")[0] != flag.split("=")[0]]
    assert run(trained[0], model_dir, "--epochs=3", *flags, flag) == 2
    name, _, value = flag.partition("=")
    value = value or "true"
    assert one_error(capsys) == (
        f"error: {name}={value}: {model_dir} was trained with {saved}; resume with "
        f"{name}={saved} or use another --model_dir")


def test_the_ghost_batch_size_cannot_change():
    """``--bn_virtual_batch_size`` changes what the trained weights expect of
    their inputs' normalization, so it is fixed like the model."""
    before = TrainConfig(data="d", model_dir="m", model="convnet_bn",
                                    bn_virtual_batch_size=32)
    saved = {"settings": resume.saved_settings(before, steps_per_epoch=4)}
    resume.check_settings(saved, resume.saved_settings(before, 4), step=4,
                          directory="m/checkpoints", model_dir=before.model_dir)
    after = TrainConfig(data="d", model_dir="m", model="convnet_bn")
    with pytest.raises(TrainerError) as error:
        resume.check_settings(saved, resume.saved_settings(after, 4), step=4,
                              directory="m/checkpoints", model_dir=after.model_dir)
    assert str(error.value) == (
        "--bn_virtual_batch_size=0: m was trained with 32; resume with "
        "--bn_virtual_batch_size=32 or use another --model_dir")


def test_fewer_epochs_than_trained_is_refused(trained, model_dir, capsys):
    capsys.readouterr()
    assert run(trained[0], model_dir, "--epochs=1", *LOOP) == 2
    assert one_error(capsys) == (
        f"error: --epochs=1: {model_dir} has trained 8 steps (2 epochs of 4); resume "
        "with --epochs=2 or more, or use another --model_dir")


def test_more_epochs_continue_with_truthful_metrics(trained, model_dir, capsys):
    capsys.readouterr()
    assert run(trained[0], model_dir, "--epochs=3", *LOOP) == 0
    assert "resuming at step 8/12" in capsys.readouterr().out
    result = read_metrics(model_dir)
    assert result["epochs"] == 3 and result["train_steps"] == 12
    assert result["train_examples"] == 12 * 8
    assert all(len(values) == 3 for values in result["history"].values())
