"""The Beam graph of the conversion job: composite transforms, one per shuffle mode.

Both modes write byte-identical shards: records ordered by shuffle key, cut
into shards of near-equal bytes by `sharding.plan_shards`.

`ConvertWithRunnerShuffle` (``--shuffle=beam``, for Dataflow, Dask and other
distributed runners)::

    ReadTasks -> EncodeByBucket -> PlanShards -> GroupAndWriteShards -> WriteShardList

  The runner's shuffle moves the records, a bucket's worth per element; a
  shard is sorted in worker memory.

`ConvertWithFileShuffle` (``--shuffle=files``, for the local runner, whose
shuffle is held in memory)::

    ReadTasks -> SpillSortedRuns -> PlanShards -> IndexSpillsByShard
              -> MergeSpillsIntoShards -> WriteShardList

  Each chunk a read task produces becomes one key-sorted spill file with a
  footer of its keys and its bucket table. Once the plan is known, each
  spill file gets a shard index beside it (the range of it each shard
  takes); a shard then merges its range of every spill file, in blocks
  (`shard_io.merge_spill_ranges`). Through Beam pass a few scalars per
  spill file and per shard, never the records or anything per bucket or
  per (spill file, shard) pair: the tables stay on disk, and the plan's
  sizes are summed by a combiner into one array per split.

Element types, as the type aliases below name them:

    ReadTask      (split, task number, the source's task)
    KeyedBatch    ((split, bucket), [(shuffle key, Example bytes), ...])
    BucketSizes   (split, (bucket ids, records, shard bytes)), int64 arrays
    Plans         {split: sharding.ShardPlan}            (one element)
    SpillRun      (split, shard_io.SpillFile)
                  (framed records in key order, then the footer, see `shard_io`)
    ShardTask     (split, shard)

Every ParDo has a single output: Beam's DaskRunner sends all tagged outputs of
a multi-output ParDo into one collection.
    WrittenShard  {"split", "file", "num_examples", "num_bytes", "sha256"}
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any, Iterable, Iterator

import apache_beam as beam
import numpy as np
from apache_beam.metrics.metric import Metrics

import mnist_contract as contract
from mnist_contract.sizes import FRAMING_BYTES

from pipeline import stop, storage
from pipeline.shard import sharding
from pipeline.shard.batches import encode_batch, group_by_bucket, spill_batch
from pipeline.shard.config import SHARDS, SPILL_DIR
from pipeline.shard.overlap import InOrder, prefetched
from pipeline.shard.shard_io import (ShardFileWriter, SpillFile, merge_spill_ranges,
                                     shard_index, write_shard_index, write_spill)

COUNTER_NAMESPACE = "mnist_pipeline"

ReadTask = tuple[str, int, Any]
KeyedBatch = tuple[tuple[str, int], list[tuple[bytes, bytes]]]
BucketSizes = tuple[str, tuple[np.ndarray, np.ndarray, np.ndarray]]
SpillRun = tuple[str, SpillFile]
ShardTask = tuple[str, int]
WrittenShard = dict


@dataclasses.dataclass(frozen=True)
class ConvertSettings:
    """Everything the graph needs, in one picklable value.

    ``temp_dir`` receives the shards (under their final names) and the spill
    files; ``shard_list_path`` the JSON list of written shards, which
    finalize reads as the source of truth.
    """

    source: Any  # a pipeline.source.sources.Source
    splits: tuple[str, ...]
    temp_dir: str
    shard_list_path: str
    target_bytes: int
    min_shards: int = 1
    image_format: str = "raw"
    compression: str = "none"
    salt: str = "mnist-tfrecords-v1"
    # {split: leading key bits naming a bucket}; derived from the source's
    # estimated size once, on the driver, so every worker uses the same.
    split_bucket_bits: dict = dataclasses.field(default=None, compare=False)

    def __post_init__(self):
        if self.split_bucket_bits is None:
            object.__setattr__(self, "split_bucket_bits", {
                split: sharding.bucket_bits_for(
                    self.source.estimated_examples(split) * SHARDS.bucket_record_bytes,
                    self.target_bytes, self.min_shards)
                for split in self.splits})

    @classmethod
    def from_options(cls, options, temp_dir: str, shard_list_path: str) -> "ConvertSettings":
        """From the run's `pipeline.options.Options` and its temp locations."""
        return cls(source=options.data_source, splits=options.splits, temp_dir=temp_dir,
                   shard_list_path=shard_list_path, target_bytes=options.target_bytes,
                   min_shards=options.min_shards, image_format=options.image_format,
                   compression=options.compression, salt=options.shuffle_salt)

    def bucket_bits(self, split: str) -> int:
        return self.split_bucket_bits[split]

    def spill_dir(self) -> str:
        return contract.join_path(self.temp_dir, SPILL_DIR)


def convert(settings: ConvertSettings, shuffle: str) -> beam.PTransform:
    """The whole job as one transform: ``beam`` or ``files`` shuffle."""
    modes = {"beam": ConvertWithRunnerShuffle, "files": ConvertWithFileShuffle}
    return modes[shuffle](settings)


class ReadTasks(beam.PTransform):
    """PBegin -> PCollection[ReadTask], spread over workers."""

    def __init__(self, settings: ConvertSettings):
        super().__init__()
        self._settings = settings

    def expand(self, pbegin):
        source = self._settings.source
        tasks = [(split, i, task) for split in self._settings.splits
                 for i, task in enumerate(source.read_tasks(split))]
        return (pbegin | "Create" >> beam.Create(tasks)
                | "Redistribute" >> beam.Reshuffle())


class _SourceFn(beam.DoFn):
    """Runs read tasks: chunks of encoded records with their shuffle keys."""

    def __init__(self, settings: ConvertSettings):
        self._settings = settings

    def setup(self):
        storage.configure_gcs()

    def _chunks(self, split: str, task, encode) -> Iterator[tuple]:
        """``encode(batch, salt, split, image_format, bucket_bits)`` of each source
        batch (`batches.encode_batch` or `batches.spill_batch`), in source order."""
        s = self._settings
        read = Metrics.counter(COUNTER_NAMESPACE, f"{split}_examples_read")
        bits = s.bucket_bits(split)
        for batch in prefetched(s.source.read(split, task)):  # decoding beside encoding
            stop.raise_if_requested()
            yield encode(batch, s.salt, split, s.image_format, bits)
            read.inc(len(batch.indices))


class _EncodeByBucketFn(_SourceFn):
    def process(self, element: ReadTask) -> Iterator[KeyedBatch]:
        split, _, task = element
        for buckets, keys, examples in self._chunks(split, task, encode_batch):
            for bucket, pairs in group_by_bucket(buckets, keys, examples):
                yield (split, bucket), pairs


def batch_sizes(element: KeyedBatch) -> BucketSizes:
    """The records and shard bytes a KeyedBatch adds to its bucket."""
    (split, bucket), pairs = element
    size = sum(len(example) for _, example in pairs) + FRAMING_BYTES * len(pairs)
    return split, (np.array([bucket]), np.array([len(pairs)]), np.array([size]))


class EncodeByBucket(beam.PTransform):
    """PCollection[ReadTask] -> PCollection[KeyedBatch].

    One element per (chunk, bucket) rather than per record: far fewer
    elements for the runner to move.
    """

    def __init__(self, settings: ConvertSettings):
        super().__init__()
        self._settings = settings

    def expand(self, tasks):
        return tasks | "Encode" >> beam.ParDo(_EncodeByBucketFn(self._settings))


class _SpillFn(_SourceFn):
    def process(self, element: ReadTask) -> Iterator[SpillRun]:
        split, task_index, task = element
        writes = InOrder()  # a chunk is written while the next one is encoded
        with stop.writing():
            try:
                for chunk, spilled in enumerate(self._chunks(split, task, spill_batch)):
                    path = contract.join_path(self._settings.spill_dir(),
                                              f"{split}-{task_index:06d}-{chunk:06d}")
                    for spill in writes.submit(write_spill, path, *spilled):
                        yield split, spill
                for spill in writes.wait_all():
                    yield split, spill
            finally:
                writes.close()


def spill_sizes(spill: SpillRun) -> BucketSizes:
    """The records and shard bytes a spill file adds to each bucket, from its table."""
    split, spill_file = spill
    return split, spill_file.bucket_sizes(spill_file.read_table())


class _SpillSizesFn(beam.DoFn):
    def setup(self):
        storage.configure_gcs()

    def process(self, element: SpillRun) -> Iterator[BucketSizes]:
        yield spill_sizes(element)


class SpillSortedRuns(beam.PTransform):
    """PCollection[ReadTask] -> PCollection[SpillRun].

    Each chunk of a read task is written, sorted by key, to its own spill
    file under ``settings.spill_dir()``.
    """

    def __init__(self, settings: ConvertSettings):
        super().__init__()
        self._settings = settings

    def expand(self, tasks):
        return tasks | "Spill" >> beam.ParDo(_SpillFn(self._settings))


class SumBucketSizes(beam.CombineFn):
    """Sums BucketSizes' parts into dense arrays indexed by bucket id.

    The accumulator is two int64 arrays as long as the largest bucket id
    seen (at most 2 ** ``ShardConfig.max_bucket_bits``), so what the runner
    holds for the plan does not grow with the number of parts; the output is
    {bucket: (records, shard bytes)} for the buckets that hold records.
    """

    def create_accumulator(self) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)

    def add_input(self, accumulator, part):
        ids, counts, sizes = (np.asarray(column, np.int64) for column in part)
        records, total = _grown(accumulator, int(ids.max()) + 1 if len(ids) else 0)
        np.add.at(records, ids, counts)
        np.add.at(total, ids, sizes)
        return records, total

    def merge_accumulators(self, accumulators):
        accumulators = list(accumulators)
        length = max(len(records) for records, _ in accumulators)
        records, total = _grown(self.create_accumulator(), length)
        for more_records, more_total in accumulators:
            records[:len(more_records)] += more_records
            total[:len(more_total)] += more_total
        return records, total

    def extract_output(self, accumulator) -> dict[int, tuple[int, int]]:
        records, total = accumulator
        ids = np.flatnonzero(records)
        return dict(zip(ids.tolist(), zip(records[ids].tolist(), total[ids].tolist())))


def _grown(accumulator, length: int) -> tuple[np.ndarray, np.ndarray]:
    """The accumulator's arrays, zero-padded to at least ``length``."""
    records, total = accumulator
    if len(records) >= length:
        return records, total
    more = max(length, 2 * len(records)) - len(records)
    return np.r_[records, np.zeros(more, np.int64)], np.r_[total, np.zeros(more, np.int64)]


def make_plans(split_sizes: list[tuple[str, dict[int, tuple[int, int]]]], target_bytes: int,
               min_shards: int) -> dict[str, sharding.ShardPlan]:
    """[(split, {bucket: (records, bytes)})] -> {split: ShardPlan}."""
    return {split: sharding.plan_shards(sizes, target_bytes, min_shards)
            for split, sizes in split_sizes}


class PlanShards(beam.PTransform):
    """PCollection[BucketSizes] -> PCollection[Plans] (a single element)."""

    def __init__(self, settings: ConvertSettings):
        super().__init__()
        self._settings = settings

    def expand(self, sizes):
        return (sizes
                | "SumPerSplit" >> beam.CombinePerKey(SumBucketSizes())
                | "CollectSplits" >> beam.combiners.ToList()
                | "Plan" >> beam.Map(make_plans, self._settings.target_bytes,
                                     self._settings.min_shards))


class _ShardWriterFn(beam.DoFn):
    def __init__(self, settings: ConvertSettings):
        self._settings = settings

    def setup(self):
        storage.configure_gcs()

    def _write(self, split: str, shard: int, num_shards: int,
               records: Iterable, blocks: bool = False) -> WrittenShard:
        """Writes records in key order under the shard's name: Example bytes, or
        (with ``blocks``) `merge_spill_ranges`'s blocks of framed records."""
        name = contract.shard_filename(split, shard, num_shards)
        with stop.writing():
            writer = ShardFileWriter(contract.join_path(self._settings.temp_dir, name),
                                     self._settings.compression)
            if blocks:
                for framed, count in records:
                    writer.write_block(framed, count)
            else:
                writer.write_all(records)
            info = writer.close()
        logging.debug("Wrote %s: %d examples, %d bytes", name, info["num_examples"],
                     info["num_bytes"])
        Metrics.counter(COUNTER_NAMESPACE, f"{split}_examples_written").inc(info["num_examples"])
        Metrics.counter(COUNTER_NAMESPACE, f"{split}_bytes_written").inc(info["num_bytes"])
        return {"split": split, "file": name, **info}


def _assign_shard(element: KeyedBatch, plans) -> tuple[tuple[str, int], list]:
    (split, bucket), pairs = element
    return (split, plans[split].bucket_to_shard[bucket]), pairs


class _SortAndWriteShardFn(_ShardWriterFn):
    def process(self, element, plans) -> Iterator[WrittenShard]:
        (split, shard), batches = element
        ordered = sorted((pair for pairs in batches for pair in pairs), key=lambda kv: kv[0])
        yield self._write(split, shard, plans[split].num_shards,
                          (example for _, example in ordered))


class GroupAndWriteShards(beam.PTransform):
    """PCollection[KeyedBatch] -> PCollection[WrittenShard], given the Plans.

    The runner's GroupByKey brings a shard's buckets together; the shard is
    sorted by key in memory and written.
    """

    def __init__(self, settings: ConvertSettings, plans):
        super().__init__()
        self._settings = settings
        self._plans = plans

    def expand(self, records):
        plans = beam.pvalue.AsSingleton(self._plans)
        return (records
                | "AssignShards" >> beam.Map(_assign_shard, plans)
                | "GroupByShard" >> beam.GroupByKey()
                | "SortAndWrite" >> beam.ParDo(_SortAndWriteShardFn(self._settings), plans))


def shards_of_rows(table: np.ndarray, plan: sharding.ShardPlan) -> np.ndarray:
    """The shard of each row of a spill file's bucket table, int64."""
    lookup = plan.bucket_to_shard
    ids = table["bucket"].tolist()
    return np.fromiter((lookup[b] for b in ids), np.int64, len(ids))


class _IndexSpillFn(beam.DoFn):
    def setup(self):
        storage.configure_gcs()

    def process(self, element: SpillRun, plans) -> Iterator[SpillRun]:
        split, spill = element
        table = spill.read_table()
        plan = plans[split]
        rows = shard_index(spill, table, shards_of_rows(table, plan), plan.num_shards)
        with stop.writing():
            write_shard_index(spill, rows)
        yield element


class IndexSpillsByShard(beam.PTransform):
    """PCollection[SpillRun] -> PCollection[SpillRun], given the Plans: the
    same runs, each once its shard index is written beside it."""

    def __init__(self, plans):
        super().__init__()
        self._plans = plans

    def expand(self, spills):
        plans = beam.pvalue.AsSingleton(self._plans)
        return spills | "WriteIndex" >> beam.ParDo(_IndexSpillFn(), plans)


def shard_tasks(_, plans: dict[str, sharding.ShardPlan]) -> Iterator[ShardTask]:
    """Every shard of every split.

    The Plans come as a side input, not as the main input: on Beam 2.77.0's
    DaskRunner a PCollection read both ways reached its singleton side
    inputs twice (tests/pipeline/test_pipeline_dask.py).
    """
    for split, plan in sorted(plans.items()):
        for shard in range(plan.num_shards):
            yield split, shard


class _MergeShardFn(_ShardWriterFn):
    def process(self, element: ShardTask, plans, spills) -> Iterator[WrittenShard]:
        split, shard = element
        files = sorted((spill for spill_split, spill in spills if spill_split == split),
                       key=lambda spill: spill.path)  # a fixed order of reads
        ranges = [r for r in (spill.shard_range(shard) for spill in files) if r is not None]
        yield self._write(split, shard, plans[split].num_shards,
                          merge_spill_ranges(ranges, SHARDS.merge_memory_bytes),
                          blocks=True)


class MergeSpillsIntoShards(beam.PTransform):
    """PCollection[SpillRun] (indexed) -> PCollection[WrittenShard], given the Plans.

    One element per shard, spread over workers; each merges its range of
    every spill file, ordered by the records' keys and copied in blocks of
    about ``ShardConfig.merge_memory_bytes``. The spill runs come as a side
    input: one small value per spill file.
    """

    def __init__(self, settings: ConvertSettings, plans):
        super().__init__()
        self._settings = settings
        self._plans = plans

    def expand(self, spills):
        plans = beam.pvalue.AsSingleton(self._plans)
        return (spills.pipeline
                | "Start" >> beam.Create([None])
                | "ListShards" >> beam.FlatMap(shard_tasks, plans)
                | "Spread" >> beam.Reshuffle()
                | "Merge" >> beam.ParDo(_MergeShardFn(self._settings), plans,
                                        beam.pvalue.AsList(spills)))


def write_shard_list(infos: list[WrittenShard], path: str) -> str:
    storage.configure_gcs()
    with stop.writing():
        storage.write_bytes(path, json.dumps(sorted(infos, key=lambda i: i["file"]),
                                             indent=1).encode())
    return path


class WriteShardList(beam.PTransform):
    """PCollection[WrittenShard] -> PCollection[str]: the shard list's path, once written.

    The list is what finalize publishes from, so the job needs no runner
    metrics to know what it wrote.
    """

    def __init__(self, settings: ConvertSettings):
        super().__init__()
        self._settings = settings

    def expand(self, written):
        return (written
                | "Collect" >> beam.combiners.ToList()
                | "Write" >> beam.Map(write_shard_list, self._settings.shard_list_path))


class ConvertWithRunnerShuffle(beam.PTransform):
    """PBegin -> PCollection[WrittenShard]: the job with the runner's shuffle."""

    def __init__(self, settings: ConvertSettings):
        super().__init__()
        self._settings = settings

    def expand(self, pbegin):
        s = self._settings
        encoded = pbegin | "ReadTasks" >> ReadTasks(s) | "EncodeByBucket" >> EncodeByBucket(s)
        plans = (encoded | "BatchSizes" >> beam.Map(batch_sizes)
                 | "PlanShards" >> PlanShards(s))
        written = encoded | "WriteShards" >> GroupAndWriteShards(s, plans)
        _ = written | "WriteShardList" >> WriteShardList(s)
        return written


class ConvertWithFileShuffle(beam.PTransform):
    """PBegin -> PCollection[WrittenShard]: the job with the sorted-spill-file shuffle."""

    def __init__(self, settings: ConvertSettings):
        super().__init__()
        self._settings = settings

    def expand(self, pbegin):
        s = self._settings
        spilled = pbegin | "ReadTasks" >> ReadTasks(s) | "SpillSortedRuns" >> SpillSortedRuns(s)
        plans = (spilled | "SpillSizes" >> beam.ParDo(_SpillSizesFn())
                 | "PlanShards" >> PlanShards(s))
        indexed = spilled | "IndexSpillsByShard" >> IndexSpillsByShard(plans)
        written = indexed | "WriteShards" >> MergeSpillsIntoShards(s, plans)
        _ = written | "WriteShardList" >> WriteShardList(s)
        return written
