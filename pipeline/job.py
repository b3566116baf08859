"""The conversion job: Beam wiring, then an all-or-nothing finalize.

Steps (per split, all splits in one job):

  ReadTasks -> Redistribute -> ReadAndEncode      one element per example,
                                                  keyed (split, bucket)
  BucketSizes -> PlanShards                       records/bytes per bucket ->
                                                  shard count and bucket->shard
  AssignShards -> GroupByShard -> WriteShards     each shard sorted by its
                                                  shuffle key, written to a
                                                  temporary folder
  CollectShardInfo -> WriteShardList              what was written

Only after the runner reports success does `finalize` move the shards under
their final names and write the metadata, manifest last. A failed or killed
run leaves an earlier dataset at the output untouched.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
import zlib
from typing import Iterable, Sequence

import apache_beam as beam
from apache_beam.metrics.metric import Metrics, MetricsFilter
from apache_beam.options.pipeline_options import (GoogleCloudOptions,
                                                  PipelineOptions,
                                                  StandardOptions)

from pipeline import contract, records, sharding, storage
from pipeline.errors import PipelineInputError
from pipeline.metadata import tfds_metadata_files
from pipeline.options import ConvertOptions
from pipeline.output import OutputLayout, finalize, prepare_output
from pipeline.sources import Source, announce, parse_source

COUNTER_NAMESPACE = "mnist_pipeline"


class ReadAndEncodeFn(beam.DoFn):
    """Runs one read task; emits ((split, bucket), (shuffle key, Example bytes))."""

    def __init__(self, source: Source, image_format: str, salt: str,
                 bucket_bits: dict[str, int]):
        self._source = source
        self._image_format = image_format
        self._salt = salt
        self._bucket_bits = bucket_bits

    def setup(self):
        storage.use_anonymous_gcs_for_emulator()

    def process(self, split_and_task):
        split, task = split_and_task
        bits = self._bucket_bits[split]
        read = Metrics.counter(COUNTER_NAMESPACE, f"{split}_examples_read")
        for batch in self._source.read(split, task):
            for index, image, label in zip(batch.indices, batch.images,
                                           batch.labels):
                key = records.shuffle_key(self._salt, split, int(index))
                example = records.encode_example(image, int(label), int(index),
                                                 self._image_format)
                yield (split, records.bucket_of(key, bits)), (key, example)
            read.inc(len(batch.indices))


def _record_size(element) -> tuple:
    (split, bucket), (_, example) = element
    return (split, bucket), (1, len(example) + records.RECORD_OVERHEAD)


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


def _assign_shard(element, plans):
    (split, bucket), keyed_example = element
    return (split, plans[split].bucket_to_shard[bucket]), keyed_example


class WriteShardFn(beam.DoFn):
    """Writes one shard, records in shuffle-key order, into the temp folder.

    The file name is final from the start (only the folder changes at
    finalize), and a retried bundle rewrites identical bytes.
    """

    def __init__(self, temp_dir: str, compression: str):
        self._temp_dir = temp_dir
        self._compression = compression

    def setup(self):
        storage.use_anonymous_gcs_for_emulator()

    def process(self, element, plans):
        (split, shard), keyed_examples = element
        ordered = sorted(keyed_examples, key=lambda kv: kv[0])
        framed = b"".join(records.frame_record(example) for _, example in ordered)
        if self._compression == "gzip":
            compressor = zlib.compressobj(6, zlib.DEFLATED, 31)  # gzip, mtime 0
            data = compressor.compress(framed) + compressor.flush()
        else:
            data = framed
        name = contract.shard_filename(split, shard, plans[split].num_shards)
        storage.write_bytes(contract.join_path(self._temp_dir, name), data)
        Metrics.counter(COUNTER_NAMESPACE, f"{split}_examples_written").inc(len(ordered))
        Metrics.counter(COUNTER_NAMESPACE, f"{split}_bytes_written").inc(len(data))
        yield {"split": split, "file": name, "num_examples": len(ordered),
               "num_bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _write_shard_list(infos: list[dict], path: str) -> None:
    storage.use_anonymous_gcs_for_emulator()
    storage.write_bytes(path, json.dumps(sorted(infos, key=lambda i: i["file"]),
                                         indent=1).encode())


def build_pipeline(p: beam.Pipeline, source: Source, conv: ConvertOptions,
                   splits: Sequence[str], layout: OutputLayout) -> None:
    target = conv.target_bytes()
    estimated_record_bytes = contract.IMAGE_BYTES + 64
    bucket_bits = {
        split: sharding.bucket_bits_for(
            source.estimated_examples(split) * estimated_record_bytes, target,
            conv.min_shards)
        for split in splits}
    tasks = [(split, task) for split in splits for task in source.read_tasks(split)]

    examples = (
        p
        | "ReadTasks" >> beam.Create(tasks)
        | "Redistribute" >> beam.Reshuffle()
        | "ReadAndEncode" >> beam.ParDo(ReadAndEncodeFn(
            source, conv.image_format, conv.shuffle_salt, bucket_bits)))
    plans = beam.pvalue.AsSingleton(
        examples
        | "BucketSizes" >> beam.Map(_record_size)
        | "SumPerBucket" >> beam.CombinePerKey(_sum_pairs)
        | "CollectBuckets" >> beam.combiners.ToList()
        | "PlanShards" >> beam.Map(_make_plans, target, conv.min_shards))
    (examples
     | "AssignShards" >> beam.Map(_assign_shard, plans)
     | "GroupByShard" >> beam.GroupByKey()
     | "WriteShards" >> beam.ParDo(WriteShardFn(layout.temp_dir,
                                                conv.compression), plans)
     | "CollectShardInfo" >> beam.combiners.ToList()
     | "WriteShardList" >> beam.Map(_write_shard_list, layout.shard_list_path))


def _check_options(conv: ConvertOptions, options: PipelineOptions) -> list[str]:
    if not conv.output:
        raise PipelineInputError("--output is required (a folder or gs://bucket/prefix)")
    if conv.target_bytes() <= 0:
        raise PipelineInputError("--target_shard_mb/--target_shard_bytes must be > 0")
    if conv.min_shards < 1:
        raise PipelineInputError("--min_shards must be >= 1")
    splits = [s for s in conv.splits.split(",") if s]
    unknown = sorted(set(splits) - set(contract.SPLITS))
    if unknown or not splits:
        raise PipelineInputError(
            f"--splits: unknown split(s) {unknown}; choose from {contract.SPLITS}")
    runner = options.view_as(StandardOptions).runner or ""
    if "Dataflow" in runner:
        if not conv.output.startswith("gs://"):
            raise PipelineInputError(
                f"{conv.output}: Dataflow workers need a gs:// --output")
        if not options.view_as(GoogleCloudOptions).temp_location:
            raise PipelineInputError("Dataflow needs --temp_location=gs://...")
    return splits


def _report_counters(result, splits: Sequence[str]) -> dict[str, int]:
    counters = {}
    query = result.metrics().query(MetricsFilter().with_namespace(COUNTER_NAMESPACE))
    for counter in query["counters"]:
        value = counter.committed if counter.committed is not None else counter.attempted
        counters[counter.key.metric.name] = counters.get(counter.key.metric.name, 0) + value
    for split in splits:
        logging.info("%s: read %d examples, wrote %d examples in %d bytes", split,
                     counters.get(f"{split}_examples_read", 0),
                     counters.get(f"{split}_examples_written", 0),
                     counters.get(f"{split}_bytes_written", 0))
    return counters


def run(argv: Sequence[str]) -> contract.Manifest:
    """Runs the whole job and returns the manifest of what it wrote."""
    storage.use_anonymous_gcs_for_emulator()
    options = PipelineOptions(list(argv))
    conv = options.view_as(ConvertOptions)
    standard = options.view_as(StandardOptions)
    if not standard.runner:
        standard.runner = "DirectRunner"  # Beam's default (Prism) needs a download
    splits = _check_options(conv, options)
    source = parse_source(conv.source, conv.download_cache_dir, conv.tfds_data_dir)
    announce(source)
    source.check()

    run_id = uuid.uuid4().hex[:12]
    layout = prepare_output(conv.output, run_id, overwrite=conv.overwrite)
    logging.info("Writing %s into temporary folder %s", ",".join(splits),
                 layout.temp_dir)
    p = beam.Pipeline(options=options)
    build_pipeline(p, source, conv, splits, layout)
    try:
        result = p.run()
        state = result.wait_until_finish()
    except Exception as e:  # the runner re-raises worker errors in many shapes
        storage.delete_tree(layout.temp_dir)
        raise _as_input_error(e) from e
    if state != "DONE":
        storage.delete_tree(layout.temp_dir)
        raise RuntimeError(f"pipeline ended in state {state}")
    counters = _report_counters(result, splits)
    manifest = finalize(layout, conv, source.description,
                        lambda m: tfds_metadata_files(m, conv.output,
                                                      source.description))
    for split in splits:
        written = counters.get(f"{split}_examples_written")
        if written is not None and written != manifest.split(split).num_examples:
            raise RuntimeError(f"{split}: counters say {written} examples written "
                               f"but the manifest lists {manifest.split(split).num_examples}")
    return manifest


def _as_input_error(error: Exception) -> Exception:
    """Finds a PipelineInputError raised in a worker, however the runner wrapped it."""
    seen = error
    while seen is not None:
        if isinstance(seen, PipelineInputError):
            return PipelineInputError(str(seen.args[0]).splitlines()[0])
        seen = seen.__cause__ or seen.__context__
    text = str(error)
    marker = "PipelineInputError: "
    if marker in text:
        return PipelineInputError(text.split(marker, 1)[1].splitlines()[0])
    return error
