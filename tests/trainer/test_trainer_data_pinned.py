"""The dataset a run trains on is pinned: a republish during training ends the
run with one line and no export; a resume on other data needs a flag;
metrics.json names the dataset."""

from __future__ import annotations

import hashlib
import json
import os
import time

import pytest
import tf_keras

from tests import trainer_data
from tests.trainer.trainer_runs import errors, one_error, run, start
from tests.trainer_data import read_metrics
from trainer import config as config_lib
from trainer.errors import TrainerError
from trainer.train import train_and_evaluate

SIZES = dict(num_train=64, num_test=16, train_shards=2, test_shards=1)


def manifest_sha(data: str) -> str:
    with open(os.path.join(data, "manifest.json"), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def republish(data: str, **changes) -> None:
    """Writes another dataset over ``data``, shards first, manifest last."""
    for name in os.listdir(data):
        os.remove(os.path.join(data, name))
    trainer_data.write_dataset(data, **{**SIZES, "seed": 5, **changes})


class _Republish(tf_keras.callbacks.Callback):
    """Republishes the data after the first fit call of the run."""

    def __init__(self, data: str, changes: dict):
        super().__init__()
        self.data, self.changes, self.done = data, changes, False

    def on_train_batch_end(self, batch, logs=None):
        if not self.done:
            self.done = True
            republish(self.data, **self.changes)


@pytest.mark.parametrize("changes", [
    {"num_train": 96},            # other shard sizes (the size check)
    {"train_shards": 3},          # other file names (a shard gone: NotFoundError)
    {"image_format": "png"},      # other records (DecodeRaw)
    {},                           # same sizes, other digits (the manifest's sha256)
])
def test_data_replaced_during_training_ends_the_run_without_export(tmp_path, changes):
    data, model_dir = str(tmp_path / "data"), str(tmp_path / "m")
    trainer_data.write_dataset(data, **SIZES)
    config = config_lib.from_preset(
        "smoke", data=data, model_dir=model_dir, epochs=4, global_batch_size=8,
        steps_per_execution=2, verbose=0, shuffle_buffer=8)
    with pytest.raises(TrainerError) as e:
        train_and_evaluate(config, callbacks=[_Republish(data, changes)])
    assert str(e.value).startswith(f"{data} changed during training: ")
    assert "stopped without exporting" in str(e.value)
    assert not os.path.exists(os.path.join(model_dir, "export"))
    assert not os.path.exists(os.path.join(model_dir, "metrics.json"))


@pytest.mark.slow
def test_republish_beside_a_running_trainer(tmp_path):
    """The issue's case as processes: the trainer is one line and exit 1."""
    data, model_dir = str(tmp_path / "data"), str(tmp_path / "m")
    trainer_data.write_dataset(data, **SIZES)
    proc = start(data, model_dir, "--loop=custom", "--epochs=200")
    try:
        while not os.path.exists(os.path.join(model_dir, "checkpoints", "checkpoint")):
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        republish(data, num_train=96)
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 1, out[-2000:] + err[-3000:]
    (line,) = errors(err)
    assert line.startswith(f"error: {data} changed during training: ")
    assert not os.path.exists(os.path.join(model_dir, "metrics.json"))


def test_metrics_and_dataset_json_name_the_dataset(tmp_path):
    data, model_dir = str(tmp_path / "data"), str(tmp_path / "m")
    manifest = trainer_data.write_dataset(data, **SIZES)
    assert run(data, model_dir, "--epochs=1") == 0
    sha = manifest_sha(data)
    assert read_metrics(model_dir)["dataset"] == {"data": data, "manifest_sha256": sha}
    with open(os.path.join(model_dir, "dataset.json")) as f:
        pinned = json.load(f)
    assert pinned["manifest_sha256"] == sha
    assert [(s["file"], s["num_bytes"], s["sha256"]) for s in pinned["shards"]] == [
        (s.file, s.num_bytes, s.sha256) for name in sorted(manifest.splits)
        for s in manifest.splits[name].shards]


def trained_then_republished(tmp_path, capsys) -> tuple[str, str, str]:
    """(data, model_dir, the first data's manifest sha256): one epoch trained
    on a dataset, then another dataset published in its place."""
    data, model_dir = str(tmp_path / "data"), str(tmp_path / "m")
    trainer_data.write_dataset(data, **SIZES)
    old = manifest_sha(data)
    assert run(data, model_dir, "--epochs=1") == 0
    republish(data)
    capsys.readouterr()
    return data, model_dir, old


def test_resume_on_another_dataset_needs_the_flag(tmp_path, capsys):
    data, model_dir, old = trained_then_republished(tmp_path, capsys)
    assert run(data, model_dir, "--epochs=2") == 2
    assert one_error(capsys) == (
        f"error: --data={data}: {model_dir} was trained on {data} (manifest sha256 "
        f"{old[:12]}...), and this is another dataset (manifest sha256 "
        f"{manifest_sha(data)[:12]}...); resume with that data, pass "
        "--allow_new_dataset to continue on this one, or use another --model_dir")
    assert run(data, model_dir, "--epochs=2", "--allow_new_dataset") == 0
    result = read_metrics(model_dir)
    assert result["dataset"]["manifest_sha256"] == manifest_sha(data)
    assert result["resumed_from_step"] == 8


def test_a_refused_run_does_not_pin_its_data(tmp_path, capsys):
    """--allow_new_dataset with a setting the checkpoints refuse: the run is
    refused and dataset.json still names the data the model was trained on,
    so a plain resume on the new data is refused in turn."""
    data, model_dir, old = trained_then_republished(tmp_path, capsys)
    assert run(data, model_dir, "--epochs=2", "--allow_new_dataset",
               "--global_batch_size=16") == 2
    assert one_error(capsys).startswith("error: --global_batch_size=16: ")
    with open(os.path.join(model_dir, "dataset.json")) as f:
        assert json.load(f)["manifest_sha256"] == old
    assert run(data, model_dir, "--epochs=2") == 2
    assert one_error(capsys).startswith(f"error: --data={data}: {model_dir} was trained on ")


@pytest.mark.parametrize("damage", ["deleted", "garbled"])
def test_checkpoints_without_a_readable_pin_are_refused(tmp_path, capsys, damage):
    """No readable dataset.json beside checkpoints: nothing says which data they
    were trained on, so a resume needs --allow_new_dataset (then re-pins)."""
    data, model_dir = str(tmp_path / "data"), str(tmp_path / "m")
    trainer_data.write_dataset(data, **SIZES)
    assert run(data, model_dir, "--epochs=1") == 0
    pin = os.path.join(model_dir, "dataset.json")
    if damage == "deleted":
        os.remove(pin)
    else:
        with open(pin, "w") as f:
            f.write('{"manifest_sha256": ')
    republish(data)
    capsys.readouterr()
    assert run(data, model_dir, "--epochs=2") == 2
    line = one_error(capsys)
    problem = "missing" if damage == "deleted" else "unreadable ("
    assert line.startswith(f"error: {pin}: {problem}"), line
    assert line.endswith(f"and {model_dir} holds checkpoints: nothing says which data they "
                         f"were trained on; pass --allow_new_dataset to continue on "
                         f"--data={data}, or use another --model_dir"), line
    assert run(data, model_dir, "--epochs=2", "--allow_new_dataset") == 0
    with open(pin) as f:
        assert json.load(f)["manifest_sha256"] == manifest_sha(data)
