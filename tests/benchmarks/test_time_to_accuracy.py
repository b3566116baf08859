"""The time-to-accuracy benchmark: its parsing and arithmetic, its refusals of
bad input, and one end-to-end run on tiny generated data.

No timing is asserted: the end-to-end run checks that the printed figures
agree with each other (target, times to target, ratio, exit status).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from benchmarks import keras_mnist_convnet as example_script
from benchmarks import time_to_accuracy as tta
from tests.helpers import REPO

# The trainer's end-of-epoch line as `trainer.loop.controller.Controller.end_epoch`
# formats it.
TRAINER_LINE = "epoch 3/20 test_loss 0.0312 test_accuracy 0.9910 (10000 examples)"


def epochs(*pairs: tuple[float, float]) -> tuple[tta.Epoch, ...]:
    return tuple(tta.Epoch(i + 1, len(pairs), acc, sec) for i, (acc, sec) in enumerate(pairs))


def run(name: str, *pairs: tuple[float, float], total: float = 100.0) -> tta.Run:
    return tta.Run(name, epochs(*pairs), total, ())


# -- parsing ----------------------------------------------------------------------------

def test_trainer_epoch_line_is_parsed_even_after_progress_output():
    assert tta.parse_trainer_epoch(TRAINER_LINE + "\n") == (3, 20, 0.9910, 10000)
    bar = "390/390 [==============================] - 31s 80ms/step - loss: 0.1 "
    assert tta.parse_trainer_epoch(bar + TRAINER_LINE) == (3, 20, 0.9910, 10000)


@pytest.mark.parametrize("line", [
    "step 100/7800 epoch 1/20 loss 0.3000 accuracy 0.9000 5000 examples/s",
    "test_loss=0.0200 test_accuracy=0.9950 test_examples=10000 train_examples=1",
    "epoch 1/15 val_accuracy 0.9800",
    "",
])
def test_other_lines_are_not_trainer_epochs(line):
    assert tta.parse_trainer_epoch(line) is None


def test_example_epoch_line_round_trips_through_its_printer():
    line = example_script.epoch_line(4, 15, 0.98765)
    assert line == "epoch 4/15 val_accuracy 0.9877"
    assert tta.parse_example_epoch(line) == (4, 15, 0.9877)
    assert tta.parse_example_epoch(TRAINER_LINE) is None


# -- time to target and ratio ---------------------------------------------------------------

def test_time_to_target_is_the_first_epoch_reaching_it():
    runs = epochs((0.98, 10.0), (0.9923, 20.0), (0.991, 30.0), (0.995, 40.0))
    assert tta.time_to_target(runs, 0.9923).seconds == 20.0
    assert tta.time_to_target(runs, 0.99).seconds == 20.0
    assert tta.time_to_target(runs, 0.9951) is None


def test_time_to_target_compares_at_four_decimals():
    # Keras's float 0.99229997 is the 0.9923 both contenders print.
    assert tta.time_to_target(epochs((0.99229997, 5.0)), 0.9923).seconds == 5.0
    assert tta.time_to_target(epochs((0.99224, 5.0)), 0.9923) is None


def test_ratio_is_bare_over_example_or_none():
    bare, example = epochs((0.99, 30.0))[0], epochs((0.99, 120.0))[0]
    assert tta.ratio(bare, example) == pytest.approx(0.25)
    assert tta.ratio(None, example) is None


def test_report_target_is_the_examples_last_accuracy_and_ratio_its_times():
    example = run("example", (0.985, 40.0), (0.9923, 80.0), (0.9921, 120.0), total=125.0)
    bare = run("bare", (0.99, 100.0), (0.9925, 200.0), total=210.0)
    lines = tta.report(example, bare)
    assert lines[0] == "target (example's final validation accuracy): 0.9921"
    assert lines[1] == ("example: time to target 80.0 s (epoch 2/3); final accuracy 0.9921 "
                        "after 3 epoch(s); total 125.0 s")
    assert lines[2] == ("bare: time to target 200.0 s (epoch 2/2); final accuracy 0.9925 "
                        "after 2 epoch(s); total 210.0 s")
    assert lines[3] == "ratio bare/example: 2.500 (goal < 1.0: MISSED)"


def test_report_when_bare_is_faster_or_never_there():
    example = run("example", (0.99, 50.0))
    assert tta.report(example, run("bare", (0.995, 25.0)))[-1] == \
        "ratio bare/example: 0.500 (goal < 1.0: met)"
    lines = tta.report(example, run("bare", (0.98, 25.0)))
    assert "bare: time to target not reached" in lines[2]
    assert lines[-1] == ("ratio bare/example: n/a (bare command did not reach the "
                         "target) (goal < 1.0: MISSED)")
    assert tta.goal_met(example, run("bare", (0.995, 25.0)))
    assert not tta.goal_met(example, run("bare", (0.995, 50.0)))  # a tie is not below 1.0
    assert not tta.goal_met(example, run("bare", (0.98, 25.0)))


# -- the data and the contenders' checks ---------------------------------------------------

@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from tests.trainer_data import write_dataset
    folder = tmp_path_factory.mktemp("data")
    write_dataset(str(folder), num_train=40, num_test=9, train_shards=2, test_shards=1)
    return folder


@pytest.mark.parametrize("image_format, compression", [("raw", "none"), ("png", "none"),
                                                       ("raw", "gzip")])
def test_read_split_gives_the_shards_digits_in_file_order(tmp_path, image_format, compression):
    from tests.trainer_data import make_arrays, write_dataset
    write_dataset(str(tmp_path), num_train=40, num_test=9, train_shards=2, test_shards=1,
                  image_format=image_format, compression=compression)
    manifest, _ = tta.read_manifest(tmp_path)
    images, labels = tta.read_split(tmp_path, manifest, "train")
    want_images, want_labels = make_arrays(40, 0)  # write_dataset's train arrays
    order = np.concatenate([np.arange(0, 40, 2), np.arange(1, 40, 2)])  # round-robin shards
    assert images.dtype == labels.dtype == np.uint8 and images.shape == (40, 28, 28)
    np.testing.assert_array_equal(labels, want_labels[order])
    np.testing.assert_array_equal(images, want_images[order].reshape(40, 28, 28))


def test_npz_is_what_the_example_loads(dataset, tmp_path):
    manifest, _ = tta.read_manifest(dataset)
    train, val = (tta.read_split(dataset, manifest, s) for s in ("train", "test"))
    expected = tta.write_npz(tmp_path / "m.npz", train, val)
    with np.load(tmp_path / "m.npz") as f:
        loaded = example_script.data_line(f["x_train"], f["y_train"], f["x_test"], f["y_test"])
    assert loaded == expected
    tta.check_example_data(tta.Run("example", (), 1.0, ("x", loaded)), expected)
    other = example_script.data_line(train[0], train[1], val[0][::-1], val[1][::-1])
    with pytest.raises(tta.ContenderFailed, match="example: loaded"):
        tta.check_example_data(tta.Run("example", (), 1.0, (other,)), expected)


def test_check_bare_wants_the_same_manifest_and_validation_count(tmp_path):
    raw = b'{"a manifest": 1}'
    metrics = {"dataset": {"manifest_sha256": hashlib.sha256(raw).hexdigest()},
               "test_examples": 9, "preset": "cpu", "strategy": "default", "replicas": 1,
               "epochs": 2, "steps_per_epoch": 3, "global_batch_size": 128}
    (tmp_path / "metrics.json").write_text(json.dumps(metrics))
    bare = tta.Run("bare", (), 1.0, (TRAINER_LINE.replace("10000", "9"),))
    assert tta.check_bare(tmp_path, raw, bare, 9) == (
        "preset cpu, default with 1 replica(s), 2 epochs of 3 steps of 128")
    with pytest.raises(tta.ContenderFailed, match="manifest sha256"):
        tta.check_bare(tmp_path, raw + b" ", bare, 9)
    with pytest.raises(tta.ContenderFailed, match=r"evaluated on \[9, 10000\] examples"):
        tta.check_bare(tmp_path, raw, tta.Run("bare", (), 1.0, (TRAINER_LINE,)), 9)


def test_stream_times_epoch_lines_and_reports_a_failed_contender(tmp_path):
    script = ("import sys; print('noise'); print('epoch 1/2 val_accuracy 0.5000', flush=True);"
              "print('boom', file=sys.stderr); sys.exit(4)")
    with pytest.raises(tta.ContenderFailed, match=r"exited 4 after 1 epoch line\(s\); "
                                                  r"its stderr ends: boom"):
        tta.stream("x", [sys.executable, "-c", script], tta.parse_example_epoch,
                   tmp_path / "err")
    ok = tta.stream("x", [sys.executable, "-c", script.replace("sys.exit(4)", "0")],
                    tta.parse_example_epoch, tmp_path / "err")
    assert ok.output == ("noise", "epoch 1/2 val_accuracy 0.5000")
    assert [(e.number, e.of, e.accuracy) for e in ok.epochs] == [(1, 2, 0.5)]
    assert 0 < ok.epochs[0].seconds <= ok.total_seconds
    with pytest.raises(tta.ContenderFailed, match="exited 0 after 0 epoch line"):
        tta.stream("x", [sys.executable, "-c", "print('no epochs')"],
                   tta.parse_example_epoch, tmp_path / "err")


@pytest.mark.timeout(60)  # a contender left running would be waited for: an hour
def test_an_interrupted_stream_kills_its_contender(tmp_path):
    script = "import os, time; print(os.getpid(), flush=True); time.sleep(3600)"
    pids = []

    def interrupt(line):
        pids.append(int(line))
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tta.stream("x", [sys.executable, "-c", script], interrupt, tmp_path / "err")
    with pytest.raises(ProcessLookupError):
        os.kill(pids[0], 0)


# -- bad input: one line, exit 2 -------------------------------------------------------------

def bad_input(capsys, argv) -> str:
    assert tta.main(argv) == tta.BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ")
    return err


def test_missing_folder(capsys, tmp_path):
    err = bad_input(capsys, [str(tmp_path / "nope"), f"--work_dir={tmp_path / 'w'}"])
    assert f"{tmp_path / 'nope'}: no such folder" in err
    assert not (tmp_path / "w").exists()


def test_folder_without_manifest(capsys, tmp_path):
    assert f"{tmp_path / 'manifest.json'}: no manifest.json" in bad_input(capsys, [str(tmp_path)])


def test_damaged_manifest(capsys, tmp_path):
    (tmp_path / "manifest.json").write_text("{not json")
    assert f"{tmp_path / 'manifest.json'}: not valid JSON" in bad_input(capsys, [str(tmp_path)])


def test_shard_that_differs_from_its_manifest(capsys, dataset, tmp_path):
    copy = tmp_path / "data"
    copy.mkdir()
    for f in dataset.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    shard = sorted(copy.glob("mnist-test.*"))[0]
    blob = bytearray(shard.read_bytes())
    blob[-10] ^= 1
    shard.write_bytes(bytes(blob))
    err = bad_input(capsys, [str(copy), f"--work_dir={tmp_path / 'w'}"])
    assert f"{shard}: size or sha256 differs from manifest.json" in err


@pytest.mark.parametrize("argv, says", [
    (["--epochs_example=0"], "--epochs_example must be >= 1, not 0"),
    (["--trainer_flags=--model_dir=x"], "--trainer_flags: --model_dir is set by the benchmark"),
    (["--trainer_flags=--epochs=0"], "--trainer_flags: trainer flags: --epochs must be >= 1, "
                                     "not 0"),
    (["--trainer_flags=--epoch=3"], "--trainer_flags: trainer flags: unrecognized arguments: "
                                    "--epoch=3"),
])
def test_bad_options(capsys, dataset, argv, says):
    assert says in bad_input(capsys, [str(dataset), *argv])


def test_work_dir_must_be_empty(capsys, dataset, tmp_path):
    (tmp_path / "old").write_text("")
    assert f"{tmp_path}: not empty" in bad_input(capsys, [str(dataset), f"--work_dir={tmp_path}"])


# -- end to end --------------------------------------------------------------------------

@pytest.mark.slow
def test_end_to_end_figures_agree(tmp_path):
    from tests.trainer_data import write_dataset
    write_dataset(str(tmp_path / "data"), num_train=512, num_test=64, train_shards=2)
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.time_to_accuracy", str(tmp_path / "data"),
         "--epochs_example=2", "--trainer_flags=--epochs=2 --steps_per_execution=2",
         f"--work_dir={tmp_path / 'work'}"],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    out = proc.stdout
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    assert "data train=512 val=64 " in out
    assert "bare ran: preset cpu, default with 1 replica(s), 2 epochs of 4 steps of 128" in out
    progress = {name: [(float(a), float(s)) for a, s in re.findall(
        rf"^  {name} epoch \d+/2 accuracy ([\d.]+) at ([\d.]+) s$", out, re.M)]
        for name in ("example", "bare")}
    assert len(progress["example"]) == len(progress["bare"]) == 2

    target = float(re.search(r"^target \(example's final validation accuracy\): ([\d.]+)$",
                             out, re.M)[1])
    assert target == progress["example"][-1][0]
    hits = {}
    for name, epochs_seen in progress.items():
        m = re.search(rf"^{name}: time to target (not reached|([\d.]+) s \(epoch (\d)/2\)); "
                      rf"final accuracy ([\d.]+) after 2 epoch\(s\); total ([\d.]+) s$", out, re.M)
        assert m, out
        first = next((i for i, (acc, _) in enumerate(epochs_seen) if acc >= target), None)
        assert (m[1] == "not reached") == (first is None)
        if first is not None:
            assert (float(m[2]), int(m[3])) == (epochs_seen[first][1], first + 1)
            hits[name] = float(m[2])
        assert float(m[4]) == epochs_seen[-1][0]
        assert float(m[5]) >= epochs_seen[-1][1]
    assert "example" in hits  # its own final accuracy, at the latest
    r = re.search(r"^ratio bare/example: (n/a|[\d.]+)", out, re.M)[1]
    if "bare" in hits:
        # Both times print at 0.1 s: the ratio of the true times lies within
        # what those roundings allow (plus the ratio's own 3 decimals).
        low = (hits["bare"] - 0.05) / (hits["example"] + 0.05)
        high = (hits["bare"] + 0.05) / max(hits["example"] - 0.05, 1e-9)
        assert low - 0.0005 <= float(r) <= high + 0.0005, (r, hits)
    else:
        assert r == "n/a"
    assert proc.returncode == (0 if r != "n/a" and float(r) < 1.0 else 1)
