"""No delete or move of the trainer goes through a symbolic link in ``model_dir``,
a lock that is a link is named, and a data file that is a FIFO is refused
rather than read forever (`mnist_common.local_paths`)."""

from __future__ import annotations

import os
import threading

import pytest

from tests import trainer_data
from tests.trainer.trainer_runs import one_error, run
from tests.trainer_data import read_metrics
from trainer.errors import TrainerError, TrainerInputError
from trainer.run import checkpoint_repair, dataset_pin, outputs
from trainer.run import lock as run_lock


def outside_folder(root) -> tuple[str, dict]:
    """A folder the trainer does not own, with its files' bytes."""
    folder = root / "serving" / "current"
    (folder / "variables").mkdir(parents=True)
    files = {"NOTE.txt": b"kept by hand\n", "saved_model.pb": b"old model",
             "variables/variables.index": b"old index"}
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return str(folder), files


def unchanged(folder: str, files: dict) -> bool:
    found = {os.path.relpath(os.path.join(d, n), folder): open(os.path.join(d, n), "rb").read()
             for d, _, names in os.walk(folder) for n in names}
    return found == files


@pytest.mark.slow
def test_an_export_that_is_a_symlink_is_replaced_not_emptied(tmp_path, capsys, caplog):
    """``model_dir/export`` a link to a serving folder: the rerun removes the
    link, commits its own export, and the serving folder keeps every file."""
    data, model_dir = str(tmp_path / "data"), str(tmp_path / "m2")
    trainer_data.write_dataset(data, num_train=40, num_test=20, train_shards=2,
                               test_shards=1)
    spe = ("--loop=custom", "--steps_per_epoch=2")
    assert run(data, model_dir, "--epochs=1", *spe) == 0
    export = os.path.join(model_dir, "export")
    target, files = outside_folder(tmp_path)
    os.rename(export, os.path.join(tmp_path, "first_export"))
    os.symlink(target, export)
    capsys.readouterr()
    assert run(data, model_dir, "--epochs=2", *spe) == 0, capsys.readouterr().err
    assert "error:" not in capsys.readouterr().err
    assert unchanged(target, files)
    assert not os.path.islink(export)
    assert outputs.uncommitted(model_dir) == ""
    assert read_metrics(model_dir)["train_steps"] == 4
    assert f"{export}: a symbolic link (to {target})" in caplog.text
    assert not [n for n in os.listdir(model_dir) if n.startswith(".export.")]


def test_commit_export_over_a_symlink_leaves_its_target(tmp_path):
    model_dir = tmp_path / "m"
    staged = model_dir / ".export.new-r1"
    staged.mkdir(parents=True)
    (staged / "saved_model.pb").write_bytes(b"new")
    target, files = outside_folder(tmp_path)
    os.symlink(target, model_dir / "export")
    outputs.commit_export(str(model_dir), str(staged), {"export_id": "r1-step4"})
    assert unchanged(target, files)
    assert (model_dir / "export" / "saved_model.pb").read_bytes() == b"new"
    assert outputs.uncommitted(str(model_dir)) == ""


@pytest.mark.parametrize("name", [".export.old-r0-step4", ".export.new-r0"])
def test_stale_export_symlinks_are_removed_as_links(tmp_path, name):
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    target, files = outside_folder(tmp_path)
    os.symlink(target, model_dir / name)
    outputs.discard_stale_exports(str(model_dir))
    outputs.discard_stale_exports(str(model_dir))  # a later start: nothing left to do
    assert unchanged(target, files)
    assert not os.path.lexists(model_dir / name)


def test_a_checkpoint_temp_symlink_is_removed_as_a_link(tmp_path):
    checkpoints = tmp_path / "m" / "checkpoints"
    checkpoints.mkdir(parents=True)
    target, files = outside_folder(tmp_path)
    os.symlink(target, checkpoints / "ckpt-10_temp")
    checkpoint_repair.clean_temp(str(checkpoints))
    assert unchanged(target, files)
    assert not os.path.lexists(checkpoints / "ckpt-10_temp")


def test_restart_removes_a_checkpoints_symlink_as_a_link(tmp_path):
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    target, files = outside_folder(tmp_path)
    os.symlink(target, model_dir / "checkpoints")
    checkpoint_repair.discard(str(model_dir / "checkpoints"))
    assert unchanged(target, files)
    assert not os.path.lexists(model_dir / "checkpoints")


def test_a_workers_scratch_symlink_is_removed_as_a_link(tmp_path):
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    target, files = outside_folder(tmp_path)
    role = outputs.Role(chief=False, scratch="workertemp_worker_1")
    os.symlink(target, model_dir / role.scratch)
    role.discard_scratch(str(model_dir))
    assert unchanged(target, files)
    assert not os.path.lexists(model_dir / role.scratch)


def test_a_lock_that_is_a_dangling_symlink_is_named(tmp_path):
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    os.symlink(tmp_path / "nowhere", model_dir / ".lock")
    with pytest.raises(TrainerError) as refused:
        run_lock.acquire(str(model_dir))
    assert str(refused.value) == (
        f"{model_dir}/.lock: cannot take the lock of --model_dir (a symbolic link to "
        f"{tmp_path / 'nowhere'}, not a lock file; remove it)")
    assert os.path.islink(model_dir / ".lock")


def finishes(call, seconds: float = 120.0):
    """``call()``'s result or exception, or a failure if it is still reading
    after ``seconds`` (a FIFO no one writes blocks its reader forever)."""
    outcome = {}

    def target():
        try:
            outcome["value"] = call()
        except BaseException as e:  # noqa: BLE001  (handed to the test)
            outcome["error"] = e
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"still reading after {seconds:.0f} s")
    return outcome


def test_a_manifest_that_is_a_fifo_is_refused(tmp_path, capsys):
    data = str(tmp_path / "data")
    trainer_data.write_dataset(data, num_train=16, num_test=8, train_shards=1,
                               test_shards=1)
    manifest = os.path.join(data, "manifest.json")
    os.remove(manifest)
    os.mkfifo(manifest)
    from trainer.data.splits import load_manifest
    outcome = finishes(lambda: load_manifest(data))
    assert isinstance(outcome.get("error"), TrainerInputError), outcome
    assert str(outcome["error"]) == f"{manifest}: is a FIFO, not a file"
    capsys.readouterr()
    assert finishes(lambda: run(data, str(tmp_path / "m"), "--epochs=1"))["value"] == 2
    assert one_error(capsys) == f"error: {manifest}: is a FIFO, not a file"


def test_a_pinned_manifest_replaced_by_a_fifo_is_a_change(tmp_path):
    data = str(tmp_path / "data")
    trainer_data.write_dataset(data, num_train=16, num_test=8, train_shards=1,
                               test_shards=1)
    pin = dataset_pin.DatasetPin(data=data, manifest_sha256="0" * 64, shards=())
    manifest = os.path.join(data, "manifest.json")
    os.remove(manifest)
    os.mkfifo(manifest)
    assert finishes(pin.changed)["value"] == f"{manifest}: is a FIFO, not a file"


def test_a_dataset_pin_that_is_a_fifo_is_unreadable(tmp_path):
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    os.mkfifo(model_dir / dataset_pin.PIN_FILE)
    outcome = finishes(lambda: dataset_pin._read_pin(str(model_dir)))
    assert outcome["value"] == (None, "unreadable (is a FIFO, not a file)")

