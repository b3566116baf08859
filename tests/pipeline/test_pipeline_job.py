"""The conversion job end to end on Beam's DirectRunner."""

import gc
import gzip
import hashlib
import json
import subprocess
import sys

import apache_beam as beam
import numpy as np
import pytest
import tensorflow as tf
from apache_beam.testing.util import assert_that, equal_to

import mnist_contract as contract
from mnist_contract import examples

from pipeline.source import idx
from pipeline.__main__ import main
from pipeline.errors import PipelineInputError
from tests import helpers
from tests.helpers import REPO, write_idx_split


def run_job(source, output, *flags):
    """The job on tiny data: several shards of it are far below 1 MB."""
    return helpers.run_job([f"--source={source}", f"--output={output}",
                            "--runner=DirectRunner", "--allow_extreme_sharding", *flags])


def read_split(output, manifest, split):
    """(images, labels, indices) of a split, read with tf.data in file order."""
    files = [contract.join_path(str(output), f) for f in manifest.split(split).files]
    ds = tf.data.TFRecordDataset(files, compression_type=manifest.tf_compression_type)
    decoded = [examples.decode_example(r.numpy(), manifest.image_format) for r in ds]
    return tuple(np.array([d[k] for d in decoded]) for k in contract.FEATURE_NAMES)


def snapshot(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_every_digit_exactly_once_bit_identical(tmp_path, idx_dir, digits):
    out = tmp_path / "out"
    manifest = run_job(idx_dir, out, "--target_shard_bytes=60000")
    for split, (images, labels) in digits.items():
        got_images, got_labels, got_indices = read_split(out, manifest, split)
        assert sorted(got_indices) == list(range(len(labels)))
        order = np.argsort(got_indices)
        np.testing.assert_array_equal(got_images[order], images)
        np.testing.assert_array_equal(got_labels[order], labels)
        assert not np.array_equal(got_indices, np.sort(got_indices)), "not shuffled"
        assert manifest.split(split).num_examples == len(labels)
    # 360 raw train records of ~855 bytes at 60 kB per shard: ceil(~308 kB / 60 kB).
    train = manifest.split("train")
    assert len(train.shards) == -(-train.num_bytes // 60000) == 6
    sizes = np.array([s.num_bytes for s in train.shards])
    assert np.all(np.abs(sizes / sizes.mean() - 1) <= 0.10), sizes
    for shard in train.shards:
        data = (out / shard.file).read_bytes()
        assert len(data) == shard.num_bytes
        assert hashlib.sha256(data).hexdigest() == shard.sha256
    assert not list(out.glob(".incomplete-*"))
    assert json.loads((out / "manifest.json").read_text())["splits"]["test"][
        "num_examples"] == 90


def test_beam_reads_it_back_and_tfds_opens_it(tmp_path, idx_dir, digits):
    out = tmp_path / "out"
    run_job(idx_dir, out, "--min_shards=3")
    with beam.Pipeline("DirectRunner") as p:
        labels = (p | beam.io.ReadFromTFRecord(str(out / "mnist-test.tfrecord-*"))
                  | beam.Map(lambda r: examples.decode_example(r, "raw")[contract.LABEL_KEY]))
        assert_that(labels, equal_to(digits["test"][1].tolist()))
    import tensorflow_datasets as tfds
    builder = tfds.builder_from_directory(str(out))
    assert builder.info.splits["train"].num_examples == 360
    assert builder.info.splits["train"].num_shards == 3
    by_index = {int(ex["index"]): ex for ex in tfds.as_numpy(
        builder.as_dataset(split="train"))}
    assert len(by_index) == 360
    np.testing.assert_array_equal(by_index[17]["image"][..., 0], digits["train"][0][17])
    assert by_index[17]["label"] == digits["train"][1][17]


def test_rerun_is_byte_identical_with_more_workers(tmp_path, idx_dir):
    run_job(idx_dir, tmp_path / "a", "--min_shards=4")
    run_job(idx_dir, tmp_path / "b", "--min_shards=4", "--direct_num_workers=2",
            "--direct_running_mode=multi_threading")
    assert snapshot(tmp_path / "a") == snapshot(tmp_path / "b")


@pytest.mark.parametrize("flags", [[], ["--compression=gzip", "--image_format=png"]])
def test_both_shuffle_modes_write_identical_files(tmp_path, idx_dir, flags):
    run_job(idx_dir, tmp_path / "beam", "--min_shards=3", "--shuffle=beam", *flags)
    run_job(idx_dir, tmp_path / "files", "--min_shards=3", "--shuffle=files", *flags)
    assert snapshot(tmp_path / "beam") == snapshot(tmp_path / "files")
    assert len(snapshot(tmp_path / "beam")) >= 6


def test_png_and_gzip(tmp_path, idx_dir, digits):
    out = tmp_path / "out"
    manifest = run_job(idx_dir, out, "--image_format=png", "--compression=gzip",
                       "--min_shards=2")
    assert manifest.tf_compression_type == "GZIP"
    images, labels, indices = read_split(out, manifest, "train")
    np.testing.assert_array_equal(images[np.argsort(indices)], digits["train"][0])
    gzip.decompress((out / manifest.split("train").files[0]).read_bytes())
    assert not (out / "dataset_info.json").exists()  # TFDS cannot read gzip


def test_refuses_existing_output_and_overwrite_replaces(tmp_path, idx_dir):
    out = tmp_path / "out"
    run_job(idx_dir, out, "--min_shards=3")
    before = snapshot(out)
    with pytest.raises(PipelineInputError, match="already holds a dataset.*--overwrite"):
        run_job(idx_dir, out)
    assert snapshot(out) == before
    manifest = run_job(idx_dir, out, "--overwrite")
    assert len(manifest.split("train").shards) == 1
    assert sorted(p.name for p in out.glob("mnist-train*")) == [
        "mnist-train.tfrecord-00000-of-00001"]


def test_stale_temp_folder_of_a_killed_run_is_removed(tmp_path, idx_dir):
    out = tmp_path / "out"
    stale = out / ".incomplete-deadbeef"
    stale.mkdir(parents=True)
    (stale / "mnist-train.tfrecord-00000-of-00001").write_bytes(b"partial")
    manifest = run_job(idx_dir, out)
    assert not stale.exists()
    assert manifest.split("train").num_examples == 360


def test_synthetic_source_runs_in_workers(tmp_path):
    manifest = run_job("synthetic:1200", tmp_path / "out", "--splits=train",
                       "--min_shards=2")
    assert list(manifest.splits) == ["train"]
    assert manifest.split("train").num_examples == 1200


def _corrupt(folder, digits, case):
    images, labels = digits["train"]
    if case == "missing file":
        (folder / "train-labels-idx1-ubyte.gz").unlink()
        return "train-labels-idx1-ubyte.gz: source file not found"
    if case == "wrong magic":
        raw = bytearray(idx.encode_idx(images))
        raw[3] = 0x02
        write_idx_split(folder, "train", images, labels, images_bytes=gzip.compress(raw))
        return "train-images-idx3-ubyte.gz: wrong IDX magic number 0x00000802"
    if case == "truncated gz":
        packed = gzip.compress(idx.encode_idx(images))
        write_idx_split(folder, "train", images, labels,
                        images_bytes=packed[: len(packed) // 2])
        return "train-images-idx3-ubyte.gz: truncated or corrupt gzip"
    if case == "count mismatch":
        write_idx_split(folder, "train", images, labels[:-1])
        return "train-labels-idx1-ubyte.gz: 359 labels for 360 images"
    if case == "images header over":  # the images header claims one more than it holds
        raw = bytearray(idx.encode_idx(images))
        raw[4:8] = (len(images) + 1).to_bytes(4, "big")
        write_idx_split(folder, "train", images, labels, images_bytes=gzip.compress(raw))
        return ("train-images-idx3-ubyte.gz: IDX header promises (361, 28, 28) but the "
                "data ends 784 bytes early")
    if case == "label out of range":
        bad = labels.copy()
        bad[5] = 10
        write_idx_split(folder, "train", images, bad)
        return "train-labels-idx1-ubyte.gz: label 10 at index 5 is outside 0-9"
    if case == "image not 28x28":
        write_idx_split(folder, "train", images[:, :, :27], labels)
        return "train-images-idx3-ubyte.gz: images are 28x27, expected 28x28"
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["missing file", "wrong magic", "truncated gz",
                                  "count mismatch", "images header over",
                                  "label out of range", "image not 28x28"])
def test_bad_input_is_one_line_and_output_untouched(tmp_path, idx_dir, digits,
                                                    capsys, case):
    out = tmp_path / "out"
    run_job(idx_dir, out)
    before = snapshot(out)
    expected = _corrupt(idx_dir, digits, case)
    assert main([f"--source={idx_dir}", f"--output={out}", "--overwrite"]) == 2
    err_lines = [l for l in capsys.readouterr().err.splitlines() if l.startswith("error:")]
    assert len(err_lines) == 1 and expected in err_lines[0], err_lines
    assert str(idx_dir) in err_lines[0]
    assert snapshot(out) == before


def test_output_not_writable(tmp_path, idx_dir, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    assert main([f"--source={idx_dir}", f"--output={blocker}/out"]) == 2
    assert f"{blocker}/out: output is not writable" in capsys.readouterr().err


def test_cli_exit_code_and_message(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", f"--source={tmp_path}/nowhere",
         f"--output={tmp_path}/out"], cwd=REPO, capture_output=True, text=True,
        timeout=300)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: {tmp_path}/nowhere/train-images-idx3-ubyte.gz: source file not found")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_tfds_source_reads_a_prepared_tfds_mnist(tmp_path, idx_dir, digits):
    """TFDS's own `mnist` builder loads our PNG output as its prepared data."""
    prepared = tmp_path / "tfds" / "mnist" / contract.TFDS_VERSION
    run_job(idx_dir, prepared, "--image_format=png")
    manifest = run_job("tfds", tmp_path / "out", f"--tfds_data_dir={tmp_path / 'tfds'}")
    images, labels, indices = read_split(tmp_path / "out", manifest, "test")
    # TFDS reads in its own order; the (image, label) pairs must be the same set.
    ours = sorted(zip(map(bytes, digits["test"][0]), digits["test"][1].tolist()))
    theirs = sorted(zip(map(bytes, images), labels.tolist()))
    assert ours == theirs
    assert sorted(indices) == list(range(len(labels)))


def test_direct_runner_jobs_never_try_prism(idx_dir, tmp_path, monkeypatch):
    """Beam's DirectRunner tries Prism first, which downloads a binary at run time."""
    from apache_beam.runners.portability import prism_runner
    attempts = []

    def refuse(self, *args, **kwargs):
        attempts.append(args)
        raise RuntimeError("the job must not run on Prism")

    monkeypatch.setattr(prism_runner.PrismRunner, "run_pipeline", refuse)
    manifest = run_job(idx_dir, tmp_path / "out")
    assert attempts == []
    assert manifest.split("train").num_examples == 360


def test_the_run_keeps_the_collector_off_earlier_objects(tmp_path, idx_dir, monkeypatch):
    """The runner and the publish run with the objects made before them frozen
    (`job.heap_frozen`), and afterwards they are collectable again."""
    from pipeline import job
    frozen = {}

    def spy(name, fn):
        def call(*args):
            frozen[name] = gc.get_freeze_count()
            return fn(*args)
        monkeypatch.setattr(job, name, call)

    spy("_run_to_end", job._run_to_end)
    spy("finalize", job.finalize)
    run_job(idx_dir, tmp_path / "out")
    assert frozen.keys() == {"_run_to_end", "finalize"}
    assert min(frozen.values()) > 10_000  # Beam's modules at least
    assert gc.get_freeze_count() == 0
