"""The input pipeline: coverage per epoch, sharding across pipelines, exact eval.

Runs in the test process on TF's ``ram://`` filesystem (the same code path as
``gs://``: everything goes through tf.io.gfile), one real directory for good
measure. ``InputContext`` objects are built by hand to play the role of
several hosts.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import tensorflow as tf

from tests import trainer_data
from tests.trainer.input_helpers import batches, context, indices, ram_dir, split
import mnist_contract as contract
from trainer.config import TrainConfig
from trainer.data import input_pipeline, splits
from trainer.errors import TrainerError
from trainer.run import plan as plan_lib


def test_one_pipeline_sees_every_example_once_per_epoch():
    files = split(ram_dir(), num_train=64, train_shards=4)
    ds = input_pipeline.train_dataset(files, 8, context(1, 0, 1), shuffle_buffer=64)
    bs = batches(ds, 16)  # two epochs of 8 batches
    first, second = indices(bs[:8]), indices(bs[8:])
    assert sorted(first) == list(range(64))
    assert sorted(second) == list(range(64))
    assert first != second  # reshuffled each epoch
    for b in bs:  # static, full batches
        assert b[contract.IMAGE_KEY].shape == (8, 28, 28, 1)
        assert b[contract.IMAGE_KEY].dtype == np.float32
        assert 0.0 <= b[contract.IMAGE_KEY].min() and b[contract.IMAGE_KEY].max() <= 1.0


@pytest.mark.parametrize("pipelines,replicas", [(1, 1), (1, 2), (2, 2)])
def test_seeded_stream_is_reproducible_and_resumes_after_consumed_steps(pipelines,
                                                                        replicas):
    """A seed fixes the batch stream; ``start_step`` continues it where it was.

    40 examples, global batch 8: an epoch is 5 global steps, so resuming at
    step 7 has to cross a reshuffle. Each global step takes replicas/pipelines
    batches from a pipeline.
    """
    files = split(ram_dir(), num_train=40, train_shards=4)
    per_pipeline = replicas // pipelines
    for i in range(pipelines):
        ctx = context(pipelines, i, replicas)
        full = indices(batches(input_pipeline.train_dataset(files, 8, ctx, seed=5),
                               12 * per_pipeline))
        again = indices(batches(input_pipeline.train_dataset(files, 8, ctx, seed=5),
                                12 * per_pipeline))
        assert full == again  # same seed, same order (file interleave included)
        resumed = input_pipeline.train_dataset(files, 8, ctx, seed=5, start_step=7)
        tail = indices(batches(resumed, 5 * per_pipeline))
        per_batch = 8 // replicas
        assert tail == full[7 * per_pipeline * per_batch:]
    other = indices(batches(input_pipeline.train_dataset(files, 8, context(1, 0, 1), seed=6), 5))
    first = indices(batches(input_pipeline.train_dataset(files, 8, context(1, 0, 1), seed=5), 5))
    assert sorted(other) == sorted(first) and other != first


@pytest.mark.parametrize("num_files,pipelines", [(4, 2), (6, 3), (2, 3), (1, 2)])
def test_pipelines_are_disjoint_and_complete(num_files, pipelines, caplog):
    n = 60
    files = split(ram_dir(), num_train=n, train_shards=num_files)
    expected = input_pipeline.pipeline_example_counts(files.counts, pipelines)
    assert sum(expected) == n
    seen = []
    with caplog.at_level(logging.WARNING, logger="trainer.data.input_pipeline"):
        for i in range(pipelines):
            # global batch == replicas: one example per replica batch, so an
            # epoch of this pipeline is exactly expected[i] batches.
            ds = input_pipeline.train_dataset(files, pipelines, context(pipelines, i, pipelines))
            got = indices(batches(ds, expected[i]))
            assert len(got) == len(set(got)) == expected[i]
            seen.extend(got)
    assert sorted(seen) == list(range(n))  # disjoint (no repeats) and complete
    warned = any("sharding by record" in r.getMessage() for r in caplog.records)
    assert warned == (num_files < pipelines)


def test_file_sharding_gives_each_pipeline_whole_files():
    files = split(ram_dir(), num_train=40, train_shards=4)
    ds = input_pipeline.train_dataset(files, 2, context(2, 1, 2))
    assert input_pipeline.pipeline_files(files, context(2, 1, 2)) == files.files[1::2]
    got = set(indices(batches(ds, 20)))
    # write_dataset deals example i to shard i % 4; pipeline 1 owns shards 1 and 3.
    assert got == {i for i in range(40) if i % 4 in (1, 3)}


@pytest.mark.parametrize("num_test,shards,batch,pipelines,replicas",
                         [(37, 2, 8, 1, 2), (37, 3, 8, 2, 4), (37, 1, 6, 2, 2),
                          (16, 2, 8, 1, 2), (5, 2, 8, 1, 1)])
def test_eval_covers_every_example_exactly_once(num_test, shards, batch, pipelines,
                                                replicas):
    files = split(ram_dir(), "test", num_test=num_test, test_shards=shards)
    steps = input_pipeline.eval_steps(files.counts, batch, replicas, pipelines)
    per_replica = batch // replicas
    per_pipeline = steps * (replicas // pipelines)
    seen = []
    for i in range(pipelines):
        ds = input_pipeline.eval_dataset(files, batch, context(pipelines, i, replicas))
        # Two passes: the eval stream repeats, aligned on whole passes.
        bs = batches(ds, 2 * per_pipeline)
        first, second = bs[:per_pipeline], bs[per_pipeline:]
        assert indices(first, weighted=True) == indices(second, weighted=True)
        for b in bs:
            assert b[contract.IMAGE_KEY].shape == (per_replica, 28, 28, 1)
            assert set(np.unique(b[input_pipeline.WEIGHT_KEY])) <= {0.0, 1.0}
            pad = b[input_pipeline.WEIGHT_KEY] == 0
            assert (b[contract.INDEX_KEY][pad] == -1).all()
            assert (b[contract.IMAGE_KEY][pad] == 0).all()
        seen.extend(indices(first, weighted=True))
    assert sorted(seen) == list(range(num_test))
    # No more steps than needed: one fewer could not hold the largest pipeline.
    largest = max(input_pipeline.pipeline_example_counts(files.counts, pipelines))
    assert (steps - 1) * per_replica * (replicas // pipelines) < largest


@pytest.mark.parametrize("image_format,compression", [("png", "none"), ("raw", "gzip"),
                                                      ("png", "gzip")])
def test_formats_decode_to_the_written_pixels(image_format, compression, tmp_path):
    out = str(tmp_path / "data")  # a real directory this time
    files = split(out, "test", num_test=10, test_shards=2, image_format=image_format,
                  compression=compression)
    assert files.compression_type == ("GZIP" if compression == "gzip" else "")
    ds = input_pipeline.eval_dataset(files, 4, context(1, 0, 1))
    images, labels = trainer_data.eval_arrays(num_test=10)
    got = 0
    for b in batches(ds, input_pipeline.eval_steps(files.counts, 4, 1, 1)):
        for img, label, index, w in zip(b[contract.IMAGE_KEY], b[contract.LABEL_KEY],
                                        b[contract.INDEX_KEY], b[input_pipeline.WEIGHT_KEY]):
            if w:
                np.testing.assert_allclose(img, images[index] / 255.0, atol=1e-6)
                assert label == labels[index]
                got += 1
    assert got == 10


def test_builders_return_datasets_and_apply_the_postprocess():
    out = ram_dir()
    trainer_data.write_dataset(out, num_train=40, num_test=13, train_shards=2, test_shards=2)
    manifest = splits.load_manifest(out)
    train_files = splits.split_files(out, manifest, "train")
    test_files = splits.split_files(out, manifest, "test")
    config = TrainConfig(data=out, model_dir="-", global_batch_size=8, cache=True)
    strategy = tf.distribute.get_strategy()
    ds = input_pipeline.train_input(strategy, train_files, config,
                          postprocess=lambda b: (b["image"], b["label"]))
    assert plan_lib.steps_per_epoch(train_files, config) == 5  # 40 // 8
    x, y = next(iter(ds))
    assert x.shape == (8, 28, 28, 1) and y.shape == (8,)
    ds, steps = input_pipeline.eval_input(strategy, test_files, config)
    assert steps == 2  # 13 examples, batches of 8
    seen = [int(i) for b in ds.take(steps) for i, w in zip(b["index"], b["weight"]) if w]
    assert sorted(seen) == list(range(13))
    with pytest.raises(TrainerError, match="fewer than one global batch of 64"):
        plan_lib.steps_per_epoch(train_files, TrainConfig(data=out, model_dir="-",
                                                      global_batch_size=64))


# -- errors -------------------------------------------------------------------

def test_missing_data_dir():
    path = ram_dir() + "/nowhere"
    with pytest.raises(TrainerError, match=f"^{path}: data directory not found$"):
        splits.load_manifest(path)


def test_missing_manifest():
    out = ram_dir()
    trainer_data.write_dataset(out, write_manifest=False)
    with pytest.raises(TrainerError, match=rf"^{out}/manifest\.json: no manifest\.json"):
        splits.load_manifest(out)


def test_malformed_manifest():
    out = ram_dir()
    trainer_data.write_dataset(out)
    tf.io.gfile.remove(f"{out}/manifest.json")  # ram:// "w" does not truncate
    with tf.io.gfile.GFile(f"{out}/manifest.json", "w") as f:
        f.write('{"format_version": 1, "dataset": "mnist", "image_format": "jpeg"}')
    with pytest.raises(TrainerError, match=r"manifest\.json: unknown image_format 'jpeg'"):
        splits.load_manifest(out)


def test_missing_shard_is_named():
    out = ram_dir()
    trainer_data.write_dataset(out, train_shards=3)
    gone = f"{out}/{contract.shard_filename('train', 1, 3)}"
    tf.io.gfile.remove(gone)
    manifest = splits.load_manifest(out)
    with pytest.raises(TrainerError, match=f"^{gone}: listed in manifest.json but missing$"):
        splits.split_files(out, manifest, "train")


def test_corrupt_file_is_found():
    out = ram_dir()
    trainer_data.write_dataset(out, train_shards=3)
    bad = f"{out}/{contract.shard_filename('train', 2, 3)}"
    files = splits.split_files(out, splits.load_manifest(out), "train")
    assert input_pipeline.find_bad_file(files) is None
    trainer_data.corrupt(bad)
    path, message = input_pipeline.find_bad_file(files)
    assert path == bad
    assert "corrupt" in message.lower() or "checksum" in message.lower()


def test_eval_steps_arithmetic():
    # 37 examples in one pipeline, 2 replicas x 4: 5 steps (40 slots, 3 padding).
    assert input_pipeline.eval_steps([19, 18], 8, 2, 1) == 5
    # Two pipelines, files 0+2 (25) vs 1 (12): the larger sets the count.
    assert input_pipeline.pipeline_example_counts([13, 12, 12], 2) == [25, 12]
    assert input_pipeline.eval_steps([13, 12, 12], 8, 4, 2) == 7
    # Fewer files than pipelines: records dealt round robin.
    assert input_pipeline.pipeline_example_counts([37], 2) == [19, 18]
