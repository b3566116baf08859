"""The trainer checks what it reads: each fault ends with one line naming the file.

Every case damages a small dataset (or model_dir) the way a user or a
broken copy might, runs the command line in-process and expects exit
status 1 with exactly one ``error:`` line, and no traceback.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import tensorflow as tf

import mnist_contract as contract
from tests import trainer_data
from tests.helpers import with_defaults
from trainer import __main__ as cli
from trainer.data import checks, input_pipeline, splits
from trainer.errors import TrainerError
from trainer.run import outputs

TRAIN = ["--preset=smoke", "--epochs=1", "--global_batch_size=8", "--steps_per_execution=2",
         "--verbose=0"]


def shard(out: str, split: str, index: int, of: int) -> str:
    return f"{out}/{contract.shard_filename(split, index, of)}"


def run(out: str, model_dir: str, *flags: str) -> int:
    return cli.main([f"--data={out}", f"--model_dir={model_dir}", *with_defaults(TRAIN, flags)])


def one_error(capsys) -> str:
    err = capsys.readouterr().err
    lines = [l for l in err.splitlines() if l.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def edit_manifest(out: str, edit) -> str:
    path = f"{out}/manifest.json"
    with open(path) as f:
        raw = json.load(f)
    edit(raw)
    with open(path, "w") as f:
        json.dump(raw, f)
    return path


@pytest.fixture
def out(tmp_path) -> str:
    """20 train / 20 test examples, 2 shards each: equal-size shards across splits."""
    path = str(tmp_path / "data")
    trainer_data.write_dataset(path, num_train=20, num_test=20, train_shards=2,
                               test_shards=2)
    return path


def test_shards_swapped_between_splits_differ_in_size(tmp_path, capsys):
    path = str(tmp_path / "data")
    trainer_data.write_dataset(path, num_train=40, num_test=12, train_shards=2,
                               test_shards=2)
    train0, test0 = shard(path, "train", 0, 2), shard(path, "test", 0, 2)
    os.rename(train0, f"{path}/swap")
    os.rename(test0, train0)
    os.rename(f"{path}/swap", test0)
    assert run(path, str(tmp_path / "m")) == 2
    assert one_error(capsys) == (
        f"error: {train0}: {os.path.getsize(train0)} bytes, but manifest.json lists "
        f"{os.path.getsize(test0)} (not the file the pipeline wrote; rerun it or restore "
        "the file)")
    assert not os.path.exists(tmp_path / "m")  # refused before anything was written


def test_same_size_shards_swapped_are_caught_by_verify_checksums(out, tmp_path, capsys):
    train0, test0 = shard(out, "train", 0, 2), shard(out, "test", 0, 2)
    assert os.path.getsize(train0) == os.path.getsize(test0)
    os.rename(train0, f"{out}/swap")
    os.rename(test0, train0)
    os.rename(f"{out}/swap", test0)
    assert run(out, str(tmp_path / "m"), "--verify_checksums") == 2
    line = one_error(capsys)
    # Whichever of the two is checked first (the evaluation input is built first).
    name, now_holds = (test0, train0) if line.startswith(f"error: {test0}") else (train0,
                                                                                  test0)
    assert line == (f"error: {name}: sha256 {checks.file_sha256(name)[:16]}... differs "
                    f"from manifest.json's {checks.file_sha256(now_holds)[:16]}... "
                    "(not the file the pipeline wrote)")


@pytest.mark.parametrize("value,message", [
    (100, "100 examples cannot fit in"),  # 10 records' bytes
    (10 ** 9, "1000000000 examples cannot fit in"),
    (True, "'num_examples' must be an integer, not true"),
    (4000.9, "'num_examples' must be an integer, not 4000.9"),
    ("4000", "'num_examples' must be an integer, not \"4000\""),
])
def test_edited_test_counts_are_refused(out, tmp_path, capsys, value, message):
    def edit(raw):
        split = raw["splits"]["test"]
        split["shards"][0]["num_examples"] = value
        if type(value) is int:  # keep the split total consistent: the harder case
            split["num_examples"] = value + split["shards"][1]["num_examples"]
    path = edit_manifest(out, edit)
    assert run(out, str(tmp_path / "m")) == 2
    line = one_error(capsys)
    assert line.startswith(f"error: {path}: ") and message in line, line


@pytest.mark.parametrize("loop", ["keras", "custom"])
def test_plausible_but_wrong_test_count_is_caught_by_the_evaluation(tmp_path, capsys,
                                                                    loop):
    path = str(tmp_path / "data")  # PNG records are small: +3 still fits the bytes
    trainer_data.write_dataset(path, num_train=32, num_test=21, train_shards=2,
                               test_shards=2, image_format="png")

    def edit(raw):
        raw["splits"]["test"]["shards"][0]["num_examples"] += 3
        raw["splits"]["test"]["num_examples"] += 3
    manifest = edit_manifest(path, edit)
    assert run(path, str(tmp_path / "m"), f"--loop={loop}") == 2
    assert one_error(capsys) == (f"error: {manifest}: lists 24 test examples, but "
                                 "evaluation read 21 from the test shards")


@pytest.mark.parametrize("loop", ["keras", "custom"])
def test_resuming_with_another_model_is_one_line(out, tmp_path, capsys, loop):
    model_dir = str(tmp_path / "m")
    assert run(out, model_dir, f"--loop={loop}", "--model=small") == 0
    capsys.readouterr()
    assert run(out, model_dir, f"--loop={loop}", "--model=guide", "--epochs=2") == 2
    assert one_error(capsys) == (
        f"error: {model_dir}/checkpoints: holds checkpoints of --model=small, not "
        "--model=guide; resume with --model=small or use another --model_dir")


def test_a_checkpoint_that_does_not_fit_is_one_line(out, tmp_path, capsys):
    """Without the saved model name (an older checkpoint), the restore error is one line."""
    model_dir = str(tmp_path / "m")
    assert run(out, model_dir, "--loop=custom", "--model=small") == 0
    capsys.readouterr()
    other = tf.train.Checkpoint(v=tf.Variable(1.0))  # holds none of the trainer's objects
    shutil.rmtree(f"{model_dir}/checkpoints")
    other.save(f"{model_dir}/checkpoints/ckpt")
    assert run(out, model_dir, "--loop=custom", "--epochs=2") == 1
    line = one_error(capsys)
    assert line.startswith(f"error: {model_dir}/checkpoints/ckpt-1: cannot resume from "
                           "this checkpoint (")


def test_model_dir_that_is_a_file(out, tmp_path, capsys):
    model_dir = tmp_path / "m"
    model_dir.write_text("not a folder")
    assert run(out, str(model_dir)) == 2
    assert one_error(capsys) == f"error: {model_dir}: --model_dir is a file, not a folder"
    assert model_dir.read_text() == "not a folder"


def test_image_format_that_does_not_match_the_records(out, tmp_path, capsys):
    manifest = edit_manifest(out, lambda raw: raw.update(image_format="png"))
    assert run(out, str(tmp_path / "m")) == 2
    line = one_error(capsys)
    assert line.startswith(f"error: {shard(out, 'train', 0, 2)}: its first record does "
                           f"not decode as {manifest}'s image_format 'png' ("), line


def test_png_records_under_a_raw_manifest(tmp_path, capsys):
    path = str(tmp_path / "data")
    trainer_data.write_dataset(path, num_train=16, num_test=4, image_format="png")
    manifest = edit_manifest(path, lambda raw: raw.update(image_format="raw"))
    assert run(path, str(tmp_path / "m")) == 2
    line = one_error(capsys)
    # Too few bytes for raw records (the manifest's plausibility check) or an
    # undecodable first record: either way one line naming the manifest.
    assert line.startswith(f"error: {manifest}: ") or f"{manifest}'s image_format 'raw'" in line


@pytest.mark.parametrize("loop", ["keras", "custom"])
def test_metrics_history_covers_the_whole_run_after_a_resume(out, tmp_path, loop):
    model_dir = str(tmp_path / "m")
    assert run(out, model_dir, f"--loop={loop}", "--seed=2") == 0
    first = trainer_data.read_metrics(model_dir)["history"]
    assert run(out, model_dir, f"--loop={loop}", "--seed=2", "--epochs=3") == 0
    metrics = trainer_data.read_metrics(model_dir)
    assert metrics["resumed_from_step"] == 2 and metrics["train_steps"] == 6
    for key, values in metrics["history"].items():
        assert len(values) == 3 and values[0] == first[key][0], key


def test_each_input_pipeline_verifies_only_its_own_files(tmp_path, monkeypatch):
    path = str(tmp_path / "data")
    trainer_data.write_dataset(path, num_train=40, num_test=4, train_shards=4)
    split = splits.split_files(path, splits.load_manifest(path), "train")
    checked = []
    real = checks.verify_checksums
    monkeypatch.setattr(checks, "verify_checksums",
                        lambda paths, shas: (checked.extend(paths), real(paths, shas)))
    monkeypatch.setattr(input_pipeline, "_verified", set())
    for i in range(2):
        ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=i,
                                         num_replicas_in_sync=2)
        input_pipeline.verify_pipeline_files(split, ctx)
        assert checked == list(split.files[i::2])
        checked.clear()
    trainer_data.corrupt(split.files[1])  # same size, other bytes: pipeline 1's file
    monkeypatch.setattr(input_pipeline, "_verified", set())
    ctx0 = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=0,
                                      num_replicas_in_sync=2)
    input_pipeline.verify_pipeline_files(split, ctx0)  # not its file: no error
    ctx1 = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1,
                                      num_replicas_in_sync=2)
    with pytest.raises(TrainerError, match=f"^{split.files[1]}: sha256 "):
        input_pipeline.verify_pipeline_files(split, ctx1)


def test_verify_checksums_passes_intact_data(out, tmp_path, capsys):
    assert run(out, str(tmp_path / "m"), "--verify_checksums", "--loop=custom") == 0
    assert "test_examples=20" in capsys.readouterr().out


def test_a_refused_bucket_lookup_does_not_stop_a_new_gs_model_dir(monkeypatch):
    """Object-only permissions refuse the bucket lookup (403): the check steps
    aside and the folder is made as without it; a missing bucket is refused."""
    asked, made = [], []

    def exists(path):
        asked.append(path)
        if path == "gs://objects-only":
            raise tf.errors.PermissionDeniedError(None, None, "403 storage.buckets.get")
        return False

    monkeypatch.setattr(tf.io.gfile, "exists", exists)
    monkeypatch.setattr(tf.io.gfile, "makedirs", made.append)
    outputs.make_model_dir("gs://objects-only/runs/m")
    assert asked == ["gs://objects-only/runs/m", "gs://objects-only"]
    assert made == ["gs://objects-only/runs/m"]
    with pytest.raises(TrainerError, match=r"bucket gs://gone does not exist"):
        outputs.make_model_dir("gs://gone/m")
    assert made == ["gs://objects-only/runs/m"]


BAD_RECORDS = {
    "label 42": (bytes(784), 42, "label 42 is not a class (0-9)"),
    "label -1": (bytes(784), -1, "label -1 is not a class (0-9)"),
    "700-byte image": (bytes(700), 3, "an image of 700 bytes, not 784 (28x28)"),
}


@pytest.mark.parametrize("loop,split,bad", [
    ("keras", "train", "label 42"), ("custom", "test", "label -1"),
    ("custom", "train", "700-byte image"), ("keras", "test", "700-byte image"),
])
def test_a_bad_record_under_a_consistent_manifest_is_named(out, tmp_path, capsys, loop,
                                                           split, bad):
    """The manifest's sizes and sha256s fit the damage: only the parse's
    checks see it. One line: the file, the record, the split, what is wrong."""
    image, label, what = BAD_RECORDS[bad]
    path = trainer_data.replace_record(out, split, 1, 2, 3,
                                       trainer_data.example_bytes(image, label))
    assert run(out, str(tmp_path / "m"), f"--loop={loop}") == 2
    assert one_error(capsys) == f"error: {path}: record 3 of split {split!r}: {what}"


def test_predict_refuses_a_split_with_a_bad_record(out, tmp_path, capsys):
    """Not an accuracy over a label of 42: the same line as the trainer's, exit 2."""
    from trainer import predict
    assert run(out, str(tmp_path / "m")) == 0
    path = trainer_data.replace_record(out, "test", 0, 2, 2,
                                       trainer_data.example_bytes(bytes(784), 42))
    capsys.readouterr()
    assert predict.main([f"--model_dir={tmp_path / 'm'}", f"--data={out}"]) == 2
    captured = capsys.readouterr()
    assert captured.err == (f"error: {path}: record 2 of split 'test': label 42 is "
                            "not a class (0-9)\n")
    assert "accuracy=" not in captured.out


@pytest.mark.parametrize("loop", ["keras", "custom"])
def test_a_diverged_run_stops_before_saving_it(out, tmp_path, capsys, loop):
    """A loss of NaN: one line, exit 1, no checkpoint, export or metrics.json
    (whose JSON would say NaN)."""
    model_dir = tmp_path / "m"
    assert run(out, str(model_dir), f"--loop={loop}", "--learning_rate=1e30") == 1
    line = one_error(capsys)
    assert line.startswith("error: training diverged: the loss is nan at step 2; "), line
    assert not list(model_dir.glob("checkpoints/ckpt-*"))
    assert not (model_dir / "export").exists() and not (model_dir / "metrics.json").exists()


def test_an_error_once_training_began_is_marked_for_the_command_line(out, tmp_path):
    """`trainer.train` marks what it raises while the model trains, so that
    the command ends its process after the line (test_trainer_signals.py);
    an error before that is not marked."""
    from trainer.config import parse_flags
    from trainer.train import train_and_evaluate
    diverging = parse_flags([f"--data={out}", f"--model_dir={tmp_path / 'm'}", *TRAIN,
                             "--learning_rate=1e30"])
    with pytest.raises(TrainerError, match="training diverged") as diverged:
        train_and_evaluate(diverging)
    assert diverged.value.after_training_began
    inside = parse_flags([f"--data={out}", f"--model_dir={out}", *TRAIN])
    with pytest.raises(TrainerError, match="--model_dir is --data") as refused:
        train_and_evaluate(inside)
    assert not refused.value.after_training_began


def test_model_dir_and_data_apart(out, tmp_path, capsys):
    """The run's files never land among the dataset's."""
    for model_dir, how in [(out, "is"), (f"{out}/run", "is inside"),
                           (os.path.dirname(out), "holds")]:
        assert run(out, model_dir) == 2
        assert one_error(capsys) == (f"error: {model_dir}: --model_dir {how} --data "
                                     f"({out}); the run's files would mix with the "
                                     "dataset's")
    assert sorted(os.listdir(out)) == sorted(
        ["manifest.json"] + [contract.shard_filename(s, i, 2) for s in ("train", "test")
                             for i in range(2)])


def test_model_dir_layout_and_links_checked_before_training(out, tmp_path, capsys):
    """A dangling symbolic link as --model_dir, a file where checkpoints/ goes:
    one line each before any step (not a lock error, not after an epoch)."""
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere")
    assert run(out, str(link)) == 2
    assert one_error(capsys) == (f"error: {link}: --model_dir is a symbolic link to "
                                 f"{tmp_path / 'nowhere'}, which does not exist")
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    (model_dir / "checkpoints").write_text("x")
    assert run(out, str(model_dir)) == 2
    assert one_error(capsys) == (f"error: {model_dir}/checkpoints: a file where the run "
                                 "keeps its checkpoints folder")
    assert sorted(os.listdir(model_dir)) == ["checkpoints"]


def test_a_pin_that_cannot_be_written_is_one_line(out, tmp_path, capsys):
    """dataset.json a folder, --allow_new_dataset given: the write fails in one line."""
    model_dir = tmp_path / "m"
    assert run(out, str(model_dir)) == 0
    (model_dir / "dataset.json").unlink()
    (model_dir / "dataset.json").mkdir()
    capsys.readouterr()
    assert run(out, str(model_dir), "--epochs=2", "--allow_new_dataset") == 1
    assert one_error(capsys) == (f"error: {model_dir}/dataset.json: cannot record the "
                                 "dataset (Is a directory)")


def test_predict_names_a_directory_given_as_a_png(out, tmp_path, capsys):
    from trainer import predict
    assert run(out, str(tmp_path / "m")) == 0
    folder = tmp_path / "digits"
    folder.mkdir()
    capsys.readouterr()
    assert predict.main([f"--model_dir={tmp_path / 'm'}", str(folder)]) == 2
    assert one_error(capsys) == f"error: {folder}: a directory, not a PNG file"
