"""The job's parts without the job: the error classifier, the shuffle choice,
and each composite transform run on small inputs with TestPipeline."""

import json
from pathlib import Path

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

import mnist_contract as contract
from mnist_contract import examples, framing

from pipeline import batches, records, sharding, transforms
from pipeline.shard_io import iter_spill_range, write_spill
from pipeline.sources import SyntheticSource
from pipeline.errors import PipelineInputError, StorageError, as_pipeline_error
from pipeline.options import ConvertOptions


def _options(*flags):
    return PipelineOptions(list(flags)).view_as(ConvertOptions)


@pytest.mark.parametrize("runner, mode", [(None, "files"), ("DirectRunner", "files"),
                                          ("DataflowRunner", "beam"),
                                          ("DaskRunner", "beam")])
def test_auto_shuffle_is_files_only_for_local_runners(runner, mode):
    assert _options().shuffle_mode(runner) == mode


@pytest.mark.parametrize("chosen", ["beam", "files"])
def test_explicit_shuffle_wins(chosen):
    assert _options(f"--shuffle={chosen}").shuffle_mode("DirectRunner") == chosen
    assert _options(f"--shuffle={chosen}").shuffle_mode("DataflowRunner") == chosen


def test_classifier_finds_input_error_by_type_and_by_text():
    try:
        try:
            raise PipelineInputError("a.gz: wrong IDX magic\nmore detail")
        except PipelineInputError as inner:
            raise RuntimeError("worker failed") from inner
    except RuntimeError as outer:
        found = as_pipeline_error(outer, "out")
    assert isinstance(found, PipelineInputError) and str(found) == "a.gz: wrong IDX magic"
    text = RuntimeError("Traceback ...\npipeline.errors.PipelineInputError: b.gz: bad\nx")
    assert str(as_pipeline_error(text, "out")) == "b.gz: bad"


@pytest.mark.parametrize("error", [RuntimeError("RetryError('Timeout of 120.0s')"),
                                   ConnectionRefusedError("refused"),
                                   OSError("disk went away")])
def test_classifier_names_the_output_for_storage_failures(error):
    found = as_pipeline_error(error, "gs://b/out")
    assert isinstance(found, StorageError)
    assert str(found).startswith("gs://b/out: storage failed during the run")


def test_classifier_leaves_unknown_errors_alone():
    assert as_pipeline_error(ValueError("a bug"), "out") is None


# --- Composite transforms on small inputs, with TestPipeline + assert_that ---

def _settings(tmp_path, source=None, **overrides):
    overrides.setdefault("target_bytes", 20_000)
    return transforms.ConvertSettings(
        source=source or SyntheticSource(60), splits=("train", "test"),
        temp_dir=str(tmp_path), shard_list_path=str(tmp_path / "shards.json"), **overrides)


def _pipeline():
    return test_pipeline.TestPipeline(runner="DirectRunner")


def test_read_tasks_lists_every_task_of_every_split(tmp_path):
    settings = _settings(tmp_path, SyntheticSource(25_000))
    with _pipeline() as p:
        tasks = p | transforms.ReadTasks(settings)
        assert_that(tasks, equal_to([("train", 0, (0, 10_000)), ("train", 1, (10_000, 20_000)),
                                     ("train", 2, (20_000, 25_000)),
                                     ("test", 0, (0, 4_166))]))


def test_encode_by_bucket_keys_every_record_once(tmp_path):
    settings = _settings(tmp_path)

    def check(batches):
        seen = []
        for (split, bucket), pairs in batches:
            keys = [k for k, _ in pairs]
            assert keys == sorted(keys)
            for key, example in pairs:
                index = examples.decode_example(example, "raw")["index"]
                assert key == records.shuffle_key(settings.salt, split, index)
                assert records.bucket_of(key, settings.bucket_bits(split)) == bucket
                seen.append((split, index))
        assert sorted(seen) == sorted([("train", i) for i in range(60)] +
                                      [("test", i) for i in range(10)])

    with _pipeline() as p:
        encoded = p | transforms.ReadTasks(settings) | transforms.EncodeByBucket(settings)
        assert_that(encoded, check)


def test_plan_shards_sums_chunks_per_split(tmp_path):
    settings = _settings(tmp_path)
    a = (np.array([1, 3, 6]), np.array([10, 10, 10]), np.array([9_000, 9_000, 9_000]))
    b = (np.array([1, 7]), np.array([10, 10]), np.array([9_000, 9_000]))
    expected = {"train": sharding.plan_shards(
        {1: (20, 18_000), 3: (10, 9_000), 6: (10, 9_000), 7: (10, 9_000)}, 20_000, 1)}
    with _pipeline() as p:
        plans = p | beam.Create([("train", a), ("train", b)]) | transforms.PlanShards(settings)
        assert_that(plans, equal_to([expected]))
    assert expected["train"].num_shards == 3


def test_write_shard_list_sorts_by_file(tmp_path):
    settings = _settings(tmp_path)
    infos = [{"split": "train", "file": f"f{i}", "num_examples": i} for i in (2, 0, 1)]
    with _pipeline() as p:
        paths = p | beam.Create(infos) | transforms.WriteShardList(settings)
        assert_that(paths, equal_to([settings.shard_list_path]))
    listed = json.loads((tmp_path / "shards.json").read_text())
    assert [i["file"] for i in listed] == ["f0", "f1", "f2"]


def test_spill_runs_cover_each_record_once_in_key_order(tmp_path):
    settings = _settings(tmp_path, SyntheticSource(25_000))

    def check(spills):
        assert len(spills) == 4  # three train chunks, one test chunk
        per_split = {"train": 0, "test": 0}
        for split, path, (ids, counts, sizes), starts, ends in spills:
            assert sizes.sum() == (ends - starts).sum() - counts.sum() * batches.KEY_BYTES
            keys = [k for b, s, e in zip(ids, starts, ends)
                    for k, _ in iter_spill_range(path, int(s), int(e), 1 << 16)]
            assert keys == sorted(keys)
            per_split[split] += len(keys)
        assert per_split == {"train": 25_000, "test": 4_166}

    with _pipeline() as p:
        out = p | transforms.ReadTasks(settings) | transforms.SpillSortedRuns(settings)
        assert_that(out, check)


@pytest.mark.parametrize("mode", [transforms.ConvertWithRunnerShuffle,
                                  transforms.ConvertWithFileShuffle])
def test_each_convert_transform_writes_the_planned_shards(tmp_path, mode):
    settings = _settings(tmp_path / mode.__name__, SyntheticSource(120), min_shards=3,
                         target_bytes=10**9)

    def check(written):
        by_split = {}
        for info in written:
            by_split.setdefault(info["split"], []).append(info)
        assert sorted(i["file"] for i in by_split["train"]) == [
            contract.shard_filename("train", n, 3) for n in range(3)]
        assert sum(i["num_examples"] for i in by_split["train"]) == 120
        assert sum(i["num_examples"] for i in by_split["test"]) == 20

    with _pipeline() as p:
        assert_that(p | mode(settings), check)
    listed = json.loads(Path(settings.shard_list_path).read_text())
    assert len(listed) == 6


def test_both_convert_transforms_write_the_same_bytes(tmp_path):
    outputs = []
    for mode in (transforms.ConvertWithRunnerShuffle, transforms.ConvertWithFileShuffle):
        settings = _settings(tmp_path / mode.__name__, SyntheticSource(300), min_shards=2,
                             compression="gzip")
        with _pipeline() as p:
            _ = p | mode(settings)
        outputs.append({f.name: f.read_bytes() for f in Path(settings.temp_dir).glob("mnist-*")})
    # ~855 bytes a record, 20 kB shards: 13 train + 3 test shards.
    assert outputs[0] == outputs[1] and len(outputs[0]) == 16


def test_spill_file_round_trip_and_damage(tmp_path):
    rng = np.random.default_rng(3)
    indices = np.arange(500)
    keys = batches.shuffle_keys("s", "train", indices)
    framed = framing.frame_records([rng.bytes(int(rng.integers(1, 300))) for _ in indices])
    buckets = batches.buckets_of(keys, 6)
    assert buckets.tolist() == [records.bucket_of(k, 6) for k in map(bytes, keys)]
    path = str(tmp_path / "spill")
    ids, starts, ends = write_spill(path, buckets, keys, framed)
    assert list(ids) == sorted(set(buckets.tolist()))
    got = []
    for bucket, start, end in zip(ids, starts, ends):  # each bucket is one byte range
        part = list(iter_spill_range(path, int(start), int(end), chunk_bytes=97))
        assert {records.bucket_of(k, 6) for k, _ in part} == {bucket}
        got.extend(part)
    # The framed records come back as written, to be copied into shards unchanged.
    assert got == sorted(zip(map(bytes, keys), framed))
    good = Path(path).read_bytes()
    for at, problem in ((40, "bad data CRC in record at byte 0"),
                        (16 + 3, "bad length CRC at byte 16")):
        data = bytearray(good)
        data[at] ^= 1
        Path(path).write_bytes(bytes(data))
        with pytest.raises(IOError, match=f"spill file damaged: .*spill: {problem}"):
            list(iter_spill_range(path, 0, len(data), chunk_bytes=1 << 16))
    Path(path).write_bytes(good[:-5])
    with pytest.raises(IOError, match="spill file damaged: .*ends 5 bytes early"):
        list(iter_spill_range(path, 0, len(good), chunk_bytes=1 << 16))
    with pytest.raises(IOError, match="spill file damaged: .*truncated record"):
        list(iter_spill_range(path, 0, len(good) - 5, chunk_bytes=1 << 16))
