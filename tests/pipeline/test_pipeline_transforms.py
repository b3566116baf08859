"""The Beam graph's parts without the job (`pipeline.shard.transforms`): each
composite transform run on small inputs with TestPipeline."""

import gzip
import hashlib
import io
import json
import pickle
from pathlib import Path

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

import mnist_contract as contract
from mnist_contract import examples, framing

from pipeline.shard import batches
from pipeline.shard import sharding
from pipeline.shard import transforms
from pipeline.shard.shard_io import (BUCKET_ROW, SHARD_ROW, ShardFileWriter, gather_records,
                                     merge_spill_ranges, shard_index, write_shard_index,
                                     write_spill)
from pipeline.source.sources import SyntheticSource


def _key(salt: str, split: str, index: int) -> bytes:
    """The shuffle key of one record index (keys do not depend on the batch)."""
    return batches.shuffle_keys(salt, split, np.array([index])).tobytes()


def _bucket(key: bytes, bucket_bits: int) -> int:
    """A key's bucket, by its definition: the key's top ``bucket_bits`` bits."""
    return int.from_bytes(key[:4], "big") >> (32 - bucket_bits)


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
                assert key == _key(settings.salt, split, index)
                assert _bucket(key, settings.bucket_bits(split)) == bucket
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


def test_sum_bucket_sizes_adds_parts_of_any_length_and_merges_accumulators():
    fn = transforms.SumBucketSizes()
    a = fn.add_input(fn.create_accumulator(),
                     (np.array([1, 3, 6]), np.array([10, 10, 10]), np.array([9, 9, 9])))
    a = fn.add_input(a, (np.array([1, 200]), np.array([1, 2]), np.array([5, 7])))
    b = fn.add_input(fn.create_accumulator(), (np.array([3]), np.array([4]), np.array([8])))
    empty = fn.add_input(fn.create_accumulator(), (np.array([]), np.array([]), np.array([])))
    merged = fn.merge_accumulators([b, a, empty, fn.create_accumulator()])
    assert fn.extract_output(merged) == {1: (11, 14), 3: (14, 17), 6: (10, 9), 200: (2, 7)}
    assert fn.extract_output(fn.create_accumulator()) == {}


def test_what_beam_carries_of_a_spill_file_does_not_grow_with_its_buckets(tmp_path):
    """A SpillRun, and a range of it that a shard reads, are a few scalars
    whether the file's 5,000 records fall in 64 buckets or in nearly 5,000."""
    keys = batches.shuffle_keys("s", "train", np.arange(5_000))
    keys = keys[batches.key_order(keys)]
    carried = {}
    for bits in (6, 16):
        spill = write_spill(str(tmp_path / f"spill-{bits:02d}"), batches.buckets_of(keys, bits),
                            keys, bytes(5_000 * 7), [7] * 5_000)
        table = spill.read_table()
        half = _range_of(spill, table, 0, len(table) // 2)
        carried[bits] = (len(table), len(pickle.dumps(("train", spill))), len(pickle.dumps(half)))
    assert carried[6][0] == 64 and carried[16][0] > 4_500
    for _, run, ranged in carried.values():
        assert run < 300 and ranged < 500


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
        for split, spill in spills:
            data = Path(spill.path).read_bytes()
            n = spill.num_records
            table = spill.read_table()
            ids, counts, sizes = spill.bucket_sizes(table)
            assert spill.index_offset == table["end"][-1] == sizes.sum()
            assert len(data) == spill.table_offset + spill.num_buckets * BUCKET_ROW.itemsize
            assert spill.table_offset == spill.index_offset + n * (batches.KEY_BYTES + 4)
            assert list(ids) == sorted(set(ids)) and counts.sum() == n
            ranged = _range_of(spill, table, 0, len(ids) - 1)
            with open(spill.path, "rb") as f:
                index_keys, ends = ranged.read_index(f, ranged.read_buckets(f))
            starts = np.r_[0, ends[:-1]]
            keys = [k.tobytes() for k in index_keys]
            assert keys == sorted(keys) and len(set(keys)) == n
            # Each record is framed where the index says, and its key is its index's.
            for key, a, b in zip(keys, starts.tolist(), ends.tolist()):
                (record,) = framing.iter_records(io.BytesIO(data[a:b]), "x")
                index = examples.decode_example(record, "raw")["index"]
                assert _key(settings.salt, split, index) == key
            per_split[split] += len(keys)
        assert per_split == {"train": 25_000, "test": 4_166}

    with _pipeline() as p:
        out = p | transforms.ReadTasks(settings) | transforms.SpillSortedRuns(settings)
        assert_that(out, check)


def test_index_spills_by_shard_gives_every_record_to_one_shard(tmp_path):
    settings = _settings(tmp_path, SyntheticSource(25_000), target_bytes=2_000_000)

    def check(indexed):
        assert len(indexed) == 4  # every run passes through, once indexed
        for split, spill in indexed:
            shards = len(Path(spill.shard_index_path).read_bytes()) // SHARD_ROW.itemsize
            ranges = [r for r in map(spill.shard_range, range(shards)) if r is not None]
            assert shards == {"train": 11, "test": 2}[split] and len(ranges) == shards
            # Consecutive shards take consecutive records, all of them once.
            assert ranges[0].first == 0 and ranges[-1].stop == spill.num_records
            assert all(a.stop == b.first and a.hi == b.lo for a, b in zip(ranges, ranges[1:]))

    with _pipeline() as p:
        spills = p | transforms.ReadTasks(settings) | transforms.SpillSortedRuns(settings)
        plans = (spills | beam.Map(transforms.spill_sizes)
                 | transforms.PlanShards(settings))
        assert_that(spills | transforms.IndexSpillsByShard(plans), check)


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


def _range_of(spill, table, first, last):
    """The range of bucket rows ``first`` to ``last`` (inclusive), as a shard
    reads it: through a shard index that gives them to shard 1 of 3."""
    shards = np.repeat([0, 1, 2], [first, last - first + 1, len(table) - last - 1])
    write_shard_index(spill, shard_index(spill, table, shards, 3))
    return spill.shard_range(1)


def _spill_files(tmp_path, count, seed, width=None):
    """``count`` spill files of random framed records (of random lengths, or all
    of ``width`` bytes); returns them and all (key, record)."""
    rng = np.random.default_rng(seed)
    spills, pairs = [], []
    for n in range(count):
        indices = np.arange(n * 1000, n * 1000 + int(rng.integers(100, 400)))
        keys = batches.shuffle_keys("s", "train", indices)
        framed = framing.frame_records([rng.bytes(width or int(rng.integers(1, 300)))
                                        for _ in indices])
        pairs.extend(zip(map(bytes, keys), framed))
        order = batches.key_order(keys).tolist()
        spills.append(write_spill(str(tmp_path / f"spill-{n}"),
                                  batches.buckets_of(keys[order], 6), keys[order],
                                  b"".join(framed[i] for i in order),
                                  [len(framed[i]) for i in order]))
    return spills, pairs


@pytest.mark.parametrize("width", [None, 40])  # records of many lengths, of one length
def test_spill_files_merge_into_key_order_within_the_memory_bound(tmp_path, width):
    spills, pairs = _spill_files(tmp_path, 5, seed=3, width=width)
    expected = b"".join(record for _, record in sorted(pairs))
    tables = [s.read_table() for s in spills]
    for spill, table in zip(spills, tables):  # each bucket is one range of records, in key order
        for i, bucket in enumerate(table["bucket"].tolist()):
            ranged = _range_of(spill, table, i, i)
            with open(spill.path, "rb") as f:
                keys, _ = ranged.read_index(f, ranged.read_buckets(f))
            assert {_bucket(k.tobytes(), 6) for k in keys} == {bucket}
    whole = [_range_of(s, t, 0, len(t) - 1) for s, t in zip(spills, tables)]
    for memory in (1, 500, 10_000, 1 << 30):
        blocks = list(merge_spill_ranges(whole, memory))
        assert b"".join(b for b, _ in blocks) == expected
        assert sum(n for _, n in blocks) == len(pairs)
        if memory == 10_000:  # blocks of about the bound, not the whole shard at once
            assert len(blocks) > 5 and max(len(b) for b, _ in blocks) < 10_000 + 400
    # A shard's share: some buckets' ranges of every spill file.
    part = [_range_of(s, t, 1, 3) for s, t in zip(spills, tables)]
    chosen = set()
    for r in part:
        with open(r.path, "rb") as f:
            chosen.update(k.tobytes() for k in r.read_index(f, r.read_buckets(f))[0])
    assert b"".join(b for b, _ in merge_spill_ranges(part, 777)) == b"".join(
        r for k, r in sorted(pairs) if k in chosen)


def test_gather_records_takes_each_record_from_its_source_in_order():
    rng = np.random.default_rng(7)
    records = [rng.bytes(int(n)) for n in rng.choice([3, 5, 900], 400)]
    src = rng.integers(0, 4, len(records))
    buffers = {r: b"".join(x for x, s in zip(records, src) if s == r) for r in range(4)}
    at = np.zeros(len(records), np.int64)
    for r in range(4):  # each source's records back to back, in the gathered order
        mine = np.flatnonzero(src == r)
        sizes = np.array([len(records[i]) for i in mine], np.int64)
        at[mine] = np.cumsum(sizes) - sizes
    out = gather_records(buffers, src, at, np.array([len(x) for x in records], np.int64))
    assert out.dtype == np.uint8 and out.tobytes() == b"".join(records)


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_shard_writer_takes_large_array_blocks_and_small_byte_blocks(tmp_path, compression):
    big = np.random.default_rng(8).integers(0, 256, 3 << 19, dtype=np.uint8)
    small = framing.frame_record(b"tail")
    writer = ShardFileWriter(str(tmp_path / "shard"), compression)
    writer.write_block(big, 1000)
    writer.write_block(small)
    info = writer.close()
    stored = (tmp_path / "shard").read_bytes()
    whole = big.tobytes() + small
    assert (gzip.decompress(stored) if compression == "gzip" else stored) == whole
    assert info == {"num_examples": 1001, "num_bytes": len(stored),
                    "sha256": hashlib.sha256(stored).hexdigest()}


def test_damaged_spill_file_fails_the_merge(tmp_path):
    (spill,), _ = _spill_files(tmp_path, 1, seed=4)
    path = Path(spill.path)
    good = path.read_bytes()
    table = spill.read_table()
    whole = _range_of(spill, table, 0, len(table) - 1)
    last = _range_of(spill, table, len(table) - 1, len(table) - 1)
    footer, rows = spill.index_offset, spill.table_offset
    # A length, its CRC, data, the last CRC of the records; a key and a length in the
    # footer; the bucket table's first and last row.
    for at, problem in ((3, "checksum mismatch in bytes 0-"), (9, "checksum mismatch"),
                        (40, "checksum mismatch"), (footer - 1, "checksum mismatch"),
                        (footer + 5, "index checksum mismatch for records 0-"),
                        (rows - 1, "index checksum mismatch"),
                        (rows + 1, "bucket table checksum mismatch in rows 0-"),
                        (len(good) - 1, "bucket table checksum mismatch")):
        data = bytearray(good)
        data[at] ^= 1
        path.write_bytes(bytes(data))
        with pytest.raises(IOError, match=rf"spill file damaged: .*spill-0: {problem}"):
            list(merge_spill_ranges([whole], 1 << 20))
    path.write_bytes(good[:-5])
    with pytest.raises(IOError, match=r"spill file damaged: .*spill-0: ends early"):
        list(merge_spill_ranges([whole], 1 << 20))
    with pytest.raises(IOError, match=r"spill file damaged: .*spill-0: ends early"):
        spill.read_table()
    path.write_bytes(good[:rows - 5])
    with pytest.raises(IOError, match=r"spill file damaged: .*spill-0: ends early"):
        list(merge_spill_ranges([whole], 1 << 20))
    # A range that avoids the damage reads fine.
    data = bytearray(good)
    data[3] ^= 1
    path.write_bytes(bytes(data))
    assert sum(n for _, n in merge_spill_ranges([last], 1 << 20)) == len(last)


def test_write_spill_refuses_records_out_of_key_order(tmp_path):
    keys = batches.shuffle_keys("s", "train", np.arange(50))
    order = batches.key_order(keys)
    backwards = order[::-1]
    with pytest.raises(ValueError, match="not in key order"):
        write_spill(str(tmp_path / "spill"), batches.buckets_of(keys[backwards], 6),
                    keys[backwards], bytes(50), [1] * 50)


def test_shard_index_gives_each_shard_its_run_of_buckets(tmp_path):
    (spill,), pairs = _spill_files(tmp_path, 1, seed=5)
    table = spill.read_table()
    m = len(table)
    # Shards 1 and 4 of 6 take nothing of this file; shard 5 takes its last bucket.
    shards = np.repeat([0, 2, 3, 5], [2, 3, m - 6, 1])
    write_shard_index(spill, shard_index(spill, table, shards, 6))
    ranges = [spill.shard_range(s) for s in range(6)]
    assert ranges[1] is None and ranges[4] is None
    taken = [r for r in ranges if r is not None]
    assert [(r.lo, r.hi) for r in taken] == [(0, 2), (2, 5), (5, m - 1), (m - 1, m)]
    assert taken[0].start == taken[0].first == 0 and taken[-1].stop == spill.num_records
    assert all(a.stop == b.first for a, b in zip(taken, taken[1:]))
    blocks = [b"".join(b.tobytes() for b, _ in merge_spill_ranges([r], 1 << 20))
              for r in taken]
    assert b"".join(blocks) == b"".join(record for _, record in sorted(pairs))
    with pytest.raises(ValueError, match="shards out of bucket order"):
        shard_index(spill, table, shards[::-1], 6)


def test_damaged_shard_index_fails_the_shard_that_reads_it(tmp_path):
    (spill,), _ = _spill_files(tmp_path, 1, seed=6)
    table = spill.read_table()
    write_shard_index(spill, shard_index(spill, table, np.zeros(len(table), np.int64), 2))
    path = Path(spill.shard_index_path)
    good = path.read_bytes()
    data = bytearray(good)
    data[SHARD_ROW.itemsize + 2] ^= 1  # shard 1's row
    path.write_bytes(bytes(data))
    assert spill.shard_range(0) is not None
    with pytest.raises(IOError, match=r"spill-0: shard index checksum mismatch for shard 1"):
        spill.shard_range(1)
    path.write_bytes(good[:-1])
    with pytest.raises(IOError, match=r"spill-0: its shard index ends before shard 1"):
        spill.shard_range(1)
