"""The Beam graph of the conversion job, in its two shuffle modes.

Both modes give byte-identical shards: records ordered by shuffle key, cut
into shards of near-equal bytes by `sharding.plan_shards`.

``beam`` (for Dataflow and other distributed runners)::

    ReadTasks -> Redistribute -> ReadAndEncode -> (BucketSizes -> SumPerBucket
    -> CollectBuckets -> PlanShards) -> AssignShards -> GroupByShard -> WriteShards

  The runner's shuffle moves the records; a shard is sorted in worker memory.

``files`` (for the local runner, whose shuffle is held in memory)::

    ReadTasks -> Redistribute -> ReadAndSpill -> (SumPerBucket -> CollectBuckets
    -> PlanShards) -> ShardRanges -> GroupRangesByShard -> MergeShards

  Each read task writes one key-sorted spill file; a shard is a streaming
  merge of one byte range per spill file. Only small descriptors pass through
  Beam, so memory does not grow with the dataset.

Both end with CollectShardInfo -> WriteShardList.
"""

from __future__ import annotations

import heapq
import json
import logging
from typing import Iterable

import apache_beam as beam
import numpy as np
from apache_beam.metrics.metric import Metrics

import mnist_contract as contract
from mnist_contract import examples, framing

from pipeline import records, sharding, storage
from pipeline.shard_io import ShardFileWriter, encode_spill, iter_spill_range

COUNTER_NAMESPACE = "mnist_pipeline"
MERGE_MEMORY_BYTES = 64 << 20


def _sum_pairs(pairs: Iterable[tuple[int, int]]) -> tuple[int, int]:
    count = size = 0
    for c, s in pairs:
        count += c
        size += s
    return count, size


def _make_plans(bucket_sizes, target_bytes: int, min_shards: int):
    """[((split, bucket), (records, bytes))] -> {split: ShardPlan}."""
    per_split: dict[str, dict[int, tuple[int, int]]] = {}
    for (split, bucket), sizes in bucket_sizes:
        per_split.setdefault(split, {})[bucket] = sizes
    return {split: sharding.plan_shards(sizes, target_bytes, min_shards)
            for split, sizes in per_split.items()}


class _SourceFn(beam.DoFn):
    def __init__(self, source, image_format: str, salt: str, bucket_bits: dict[str, int]):
        self._source = source
        self._image_format = image_format
        self._salt = salt
        self._bucket_bits = bucket_bits

    def setup(self):
        storage.use_anonymous_gcs_for_emulator()

    def _keyed_examples(self, split, task):
        read = Metrics.counter(COUNTER_NAMESPACE, f"{split}_examples_read")
        for batch in self._source.read(split, task):
            for index, image, label in zip(batch.indices, batch.images, batch.labels):
                yield (records.shuffle_key(self._salt, split, int(index)),
                       examples.encode_example(
                           {contract.IMAGE_KEY: image, contract.LABEL_KEY: int(label),
                            contract.INDEX_KEY: int(index)}, self._image_format))
            read.inc(len(batch.indices))


class ReadAndEncodeFn(_SourceFn):
    """Runs one read task; emits ((split, bucket), (shuffle key, Example bytes))."""

    def process(self, element):
        split, _, task = element
        bits = self._bucket_bits[split]
        for key, example in self._keyed_examples(split, task):
            yield (split, records.bucket_of(key, bits)), (key, example)


@beam.typehints.with_output_types(beam.typehints.Any)
class ReadAndSpillFn(_SourceFn):
    """Runs one read task into a sorted spill file.

    Emits ((split, bucket), (records, bytes)) per bucket, and on the ``spill``
    output one descriptor of the file: its path and per-bucket byte ranges.
    """

    def __init__(self, spill_dir: str, *args):
        super().__init__(*args)
        self._spill_dir = spill_dir

    def process(self, element):
        split, task_index, task = element
        data, ids, counts, starts, ends, sizes = encode_spill(
            list(self._keyed_examples(split, task)), self._bucket_bits[split])
        path = contract.join_path(self._spill_dir, f"{split}-{task_index:06d}")
        storage.write_bytes(path, data)
        for bucket, count, size in zip(ids.tolist(), counts.tolist(), sizes.tolist()):
            yield (split, bucket), (count, size)
        yield beam.pvalue.TaggedOutput("spill", (split, path, ids, starts, ends))


def _shard_ranges(spill, plans):
    """One spill descriptor -> ((split, shard), (path, start, end)) per shard it feeds."""
    split, path, ids, starts, ends = spill
    if not len(ids):
        return
    lookup = plans[split].bucket_to_shard
    shards = np.fromiter((lookup[b] for b in ids.tolist()), np.int64, len(ids))
    cuts = np.flatnonzero(np.diff(shards)) + 1
    for first, last in zip(np.r_[0, cuts], np.r_[cuts, len(ids)] - 1):
        yield (split, int(shards[first])), (path, int(starts[first]), int(ends[last]))


def _assign_shard(element, plans):
    (split, bucket), keyed_example = element
    return (split, plans[split].bucket_to_shard[bucket]), keyed_example


class _ShardWriterFn(beam.DoFn):
    def __init__(self, temp_dir: str, compression: str):
        self._temp_dir = temp_dir
        self._compression = compression

    def setup(self):
        storage.use_anonymous_gcs_for_emulator()

    def _write(self, split: str, shard: int, num_shards: int, examples):
        """Writes examples (already in key order) under the shard's final name."""
        name = contract.shard_filename(split, shard, num_shards)
        writer = ShardFileWriter(contract.join_path(self._temp_dir, name), self._compression)
        for example in examples:
            writer.write(example)
        info = writer.close()
        logging.info("Wrote %s: %d examples, %d bytes", name, info["num_examples"],
                     info["num_bytes"])
        Metrics.counter(COUNTER_NAMESPACE, f"{split}_examples_written").inc(info["num_examples"])
        Metrics.counter(COUNTER_NAMESPACE, f"{split}_bytes_written").inc(info["num_bytes"])
        return {"split": split, "file": name, **info}


class WriteShardFn(_ShardWriterFn):
    """Beam mode: sorts one grouped shard by key and writes it."""

    def process(self, element, plans):
        (split, shard), keyed_examples = element
        ordered = sorted(keyed_examples, key=lambda kv: kv[0])
        yield self._write(split, shard, plans[split].num_shards,
                          (example for _, example in ordered))


class MergeShardFn(_ShardWriterFn):
    """Files mode: streams one shard as a k-way merge of sorted spill ranges."""

    def process(self, element, plans):
        (split, shard), ranges = element
        ranges = sorted(ranges)
        chunk = max(16 << 10, min(1 << 20, MERGE_MEMORY_BYTES // max(len(ranges), 1)))
        streams = [iter_spill_range(path, start, end, chunk) for path, start, end in ranges]
        yield self._write(split, shard, plans[split].num_shards,
                          (example for _, example in heapq.merge(*streams)))


def _write_shard_list(infos: list[dict], path: str) -> None:
    storage.use_anonymous_gcs_for_emulator()
    storage.write_bytes(path, json.dumps(sorted(infos, key=lambda i: i["file"]),
                                         indent=1).encode())


def build(p: beam.Pipeline, source, splits, *, image_format: str, compression: str,
          salt: str, target_bytes: int, min_shards: int, temp_dir: str,
          shard_list_path: str, shuffle: str) -> None:
    """Adds the whole job to ``p``; ``shuffle`` is ``beam`` or ``files``."""
    estimated_record_bytes = contract.IMAGE_BYTES + 64
    bucket_bits = {split: sharding.bucket_bits_for(
        source.estimated_examples(split) * estimated_record_bytes, target_bytes, min_shards)
        for split in splits}
    tasks = [(split, i, task) for split in splits
             for i, task in enumerate(source.read_tasks(split))]
    source_args = (source, image_format, salt, bucket_bits)
    read = p | "ReadTasks" >> beam.Create(tasks) | "Redistribute" >> beam.Reshuffle()

    if shuffle == "files":
        outputs = read | "ReadAndSpill" >> beam.ParDo(
            ReadAndSpillFn(contract.join_path(temp_dir, "spill"), *source_args)
        ).with_outputs("spill", main="sizes")
        bucket_sizes, spills = outputs.sizes, outputs.spill
    else:
        examples = read | "ReadAndEncode" >> beam.ParDo(ReadAndEncodeFn(*source_args))
        bucket_sizes = examples | "BucketSizes" >> beam.Map(
            lambda kv: (kv[0], (1, len(kv[1][1]) + framing.RECORD_OVERHEAD)))

    plans = beam.pvalue.AsSingleton(
        bucket_sizes
        | "SumPerBucket" >> beam.CombinePerKey(_sum_pairs)
        | "CollectBuckets" >> beam.combiners.ToList()
        | "PlanShards" >> beam.Map(_make_plans, target_bytes, min_shards))

    if shuffle == "files":
        written = (spills
                   | "ShardRanges" >> beam.FlatMap(_shard_ranges, plans)
                   | "GroupRangesByShard" >> beam.GroupByKey()
                   | "MergeShards" >> beam.ParDo(MergeShardFn(temp_dir, compression), plans))
    else:
        written = (examples
                   | "AssignShards" >> beam.Map(_assign_shard, plans)
                   | "GroupByShard" >> beam.GroupByKey()
                   | "WriteShards" >> beam.ParDo(WriteShardFn(temp_dir, compression), plans))
    _ = (written
         | "CollectShardInfo" >> beam.combiners.ToList()
         | "WriteShardList" >> beam.Map(_write_shard_list, shard_list_path))
