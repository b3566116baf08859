"""Input pipeline: the pipeline's TFRecord shards → per-replica batches.

Everything here goes through ``tf.io.gfile`` and ``tf.data``, never ``open``
or ``os.path``, so the same code reads a local directory, ``gs://`` on a TPU
VM, or TF's in-memory ``ram://`` filesystem (which the tests use to prove it).

Two builders hand a loop a distributed dataset: `train_input` (endless; an
epoch is `steps_per_epoch` steps) and `eval_input` (with the steps of one
evaluation pass). Each gives
``strategy.distribute_datasets_from_function`` a ``dataset_fn`` that
TensorFlow calls once per input pipeline (one per host/worker), building the
batches of that pipeline's replicas with `train_dataset` / `eval_dataset`
(pure functions of the split and an ``InputContext``, tested without a
strategy). Batches are dicts (image, label, index, weight); a loop that
wants another form passes a ``postprocess`` function (the Keras loop:
``(image, label)``), so this module knows nothing of Keras.

Training (`train_dataset`) takes one of two paths; the log names the one
taken by each pipeline. With ``--cache`` and a share that fits the memory
bound (`trainer.data.in_memory.fits_in_memory`), the pipeline decodes its
share once (`decode_share`) and draws every batch from the decoded arrays,
each epoch a full permutation keyed by the seed and the epoch
(`trainer.data.in_memory`). Otherwise it streams: shard *files* across
pipelines when there are at least as many files as pipelines (no pipeline
reads bytes another one discards); otherwise read everything in a fixed
order and keep every n-th record (a logged warning: each pipeline then reads
all the data; the in-memory path shares out its records the same way).
Files are read in parallel, each reader passing on blocks of records;
records are then shuffled through a buffer, repeated, batched with
``drop_remainder=True`` (TPUs need static shapes) and only then parsed: one
vectorized ``tf.io.parse_example`` per batch instead of one op per record.
Both paths cut batches across epoch ends, so every epoch holds each example
of the share exactly once.

Order, with a seed and without, and where a resumed run (``start_step``)
picks the stream up: docs/trainer.md, "Resuming". Without a seed the file
interleave is non-deterministic: throughput over order, as shuffling
follows anyway.

Evaluation (`eval_dataset`): every example exactly once. The last,
partial batch is padded to the full per-replica size and the padding gets
``weight`` 0, and pipelines that run out early emit all-padding batches, so
that every replica runs the same number of steps with static shapes; the
loops weight their metrics by ``weight``. The number of steps follows from
the manifest's per-file counts, so no pass over the data is needed to know
it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, Callable, Optional, Sequence

import numpy as np

import tensorflow as tf

import mnist_contract as contract
from mnist_contract import examples
from trainer.data import checks, in_memory
from trainer.data.splits import SplitFiles
from trainer.errors import summarize_error

log = logging.getLogger(__name__)

AUTOTUNE = tf.data.AUTOTUNE
WEIGHT_KEY = "weight"  # 1 for a real example, 0 for eval padding
BAD_LABEL = "a label that is not a class (0-9)"
BAD_IMAGE = "an image that is not 28x28 bytes"
MAX_PARALLEL_FILES = 16
# Records a file reader passes on at a time. Measured on 2 CPU cores: the
# parallel interleave ran at ~0.55x the speed of from_tensor_slices when it
# moved records one by one, ~0.8-1x with blocks of 256.
RECORDS_PER_READ = 256
DECODE_BLOCK = 4096  # records per parse when a share is decoded into memory


@dataclasses.dataclass(frozen=True)
class InputSettings:
    """What the input pipelines read with: the flags of that name
    (`trainer.run.plan.settings_of`)."""

    global_batch_size: int
    cache: bool
    seed: Optional[int]
    shuffle_buffer: int
    verify_checksums: bool


def shards_files(num_files: int, num_pipelines: int) -> bool:
    """Whether pipelines split the files between them (else: the records)."""
    return num_files >= num_pipelines


def pipeline_example_counts(counts: Sequence[int], num_pipelines: int) -> list[int]:
    """How many examples each input pipeline reads, for either sharding mode."""
    if shards_files(len(counts), num_pipelines):
        return [sum(counts[i::num_pipelines]) for i in range(num_pipelines)]
    total = sum(counts)
    return [len(range(i, total, num_pipelines)) for i in range(num_pipelines)]


def eval_steps(counts: Sequence[int], global_batch_size: int, num_replicas: int,
               num_pipelines: int) -> int:
    """Global eval steps that cover every example once, padding the rest.

    Each step takes one per-replica batch for every replica; a pipeline
    serves ``num_replicas // num_pipelines`` replicas, so the pipeline with
    the most examples sets the count.
    """
    per_replica = global_batch_size // num_replicas
    per_pipeline_step = per_replica * (num_replicas // num_pipelines)
    return max(math.ceil(n / per_pipeline_step)
               for n in pipeline_example_counts(counts, num_pipelines))


def decode_batch(serialized: tf.Tensor, image_format: str,
                 checked: bool = True) -> dict[str, tf.Tensor]:
    """Vectorized parse + decode of a batch of serialized Examples: uint8
    images ``[n, 28, 28, 1]``, labels and indices (`trainer.predict` feeds
    these pixels to the export as they are).

    ``checked``: every label is a class and every image 28x28, else an
    ``InvalidArgumentError`` (a record under a manifest that agrees with it
    still carries what its writer put there); `find_bad_file` then names the
    file and the record. A few vectorized comparisons per batch: their cost
    is measured against ``checked=False`` by benchmarks/trainer_benchmark.py.
    """
    feats = tf.io.parse_example(serialized, examples.parse_spec())
    raw, labels = feats[contract.IMAGE_KEY], feats[contract.LABEL_KEY]
    asserts = [tf.debugging.assert_non_negative(labels, message=BAD_LABEL),
               tf.debugging.assert_less(labels, tf.constant(contract.NUM_CLASSES,
                                                            labels.dtype),
                                        message=BAD_LABEL)] if checked else []
    if image_format == "raw" and checked:
        asserts.append(tf.debugging.assert_equal(
            tf.strings.length(raw), int(np.prod(contract.IMAGE_SHAPE)), message=BAD_IMAGE))
    with tf.control_dependencies(asserts):
        if image_format == "raw":
            pixels = tf.io.decode_raw(raw, tf.uint8)
        else:  # png: decoding is per image, there is no batched PNG kernel
            pixels = tf.map_fn(
                lambda s: tf.ensure_shape(
                    tf.io.decode_png(s, channels=contract.IMAGE_CHANNELS),
                    contract.IMAGE_SHAPE),
                raw, fn_output_signature=tf.TensorSpec(None, tf.uint8))
    return {contract.IMAGE_KEY: tf.reshape(pixels, (-1,) + contract.IMAGE_SHAPE),
            contract.LABEL_KEY: labels, contract.INDEX_KEY: feats[contract.INDEX_KEY]}


def _train_form(batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """A decoded batch as the loops take it: images normalized to [0, 1],
    every row weighted 1."""
    labels = batch[contract.LABEL_KEY]
    return {
        contract.IMAGE_KEY: tf.cast(batch[contract.IMAGE_KEY], tf.float32) / 255.0,
        contract.LABEL_KEY: labels,
        contract.INDEX_KEY: batch[contract.INDEX_KEY],
        WEIGHT_KEY: tf.ones_like(labels, tf.float32),
    }


def _parse_batch(serialized: tf.Tensor, image_format: str) -> dict[str, tf.Tensor]:
    """`decode_batch` in `_train_form`."""
    return _train_form(decode_batch(serialized, image_format))


def _pad_batch(batch: dict[str, tf.Tensor], size: int) -> dict[str, tf.Tensor]:
    """Pads a (possibly partial) batch to ``size`` rows; padding has weight 0."""
    pad = size - tf.shape(batch[contract.LABEL_KEY])[0]
    out = {}
    for key, value in batch.items():
        fill = -1 if key == contract.INDEX_KEY else 0
        paddings = [[0, pad]] + [[0, 0]] * (value.shape.rank - 1)
        padded = tf.pad(value, paddings, constant_values=tf.cast(fill, value.dtype))
        out[key] = tf.ensure_shape(padded, [size] + value.shape[1:].as_list())
    return out


Postprocess = Optional[Callable[[dict], Any]]


def pipeline_files(split: SplitFiles, ctx: tf.distribute.InputContext) -> tuple[str, ...]:
    """The files input pipeline ``ctx.input_pipeline_id`` reads (all, when sharding by record)."""
    n = ctx.num_input_pipelines
    if n > 1 and shards_files(len(split.files), n):
        return split.files[ctx.input_pipeline_id::n]
    return split.files


def _records(split: SplitFiles, ctx: tf.distribute.InputContext, training: bool,
             seed: Optional[int]) -> tf.data.Dataset:
    """This pipeline's serialized records: its files, or every n-th record of all."""
    num_pipelines, pipeline_id = ctx.num_input_pipelines, ctx.input_pipeline_id
    files = pipeline_files(split, ctx)
    by_file = shards_files(len(split.files), num_pipelines)
    if not by_file:
        log.warning(
            "split %r: %d file(s) for %d input pipelines; sharding by record, "
            "so every pipeline reads all files (write at least %d shards to "
            "avoid this)", split.name, len(split.files), num_pipelines, num_pipelines)
    ds = tf.data.Dataset.from_tensor_slices(list(files))
    if training and by_file:
        ds = ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    # Record-level sharding needs the same order in every pipeline; a seed
    # asks for a reproducible order.
    deterministic = not (training and by_file) or seed is not None
    # Each reader thread hands over blocks of records, not single ones:
    # passing every record between threads costs more than reading it.
    ds = ds.interleave(
        lambda f: tf.data.TFRecordDataset(
            f, compression_type=split.compression_type).batch(RECORDS_PER_READ),
        cycle_length=min(len(files), MAX_PARALLEL_FILES),
        num_parallel_calls=AUTOTUNE, deterministic=deterministic).unbatch()
    if not by_file and num_pipelines > 1:
        ds = ds.shard(num_pipelines, pipeline_id)
    return ds


def consumed_batches(start_step: int, ctx: tf.distribute.InputContext) -> int:
    """Batches this pipeline handed out in ``start_step`` global steps: each
    step takes one per replica the pipeline serves."""
    return start_step * (ctx.num_replicas_in_sync // ctx.num_input_pipelines)


def train_dataset(split: SplitFiles, global_batch_size: int,
                  ctx: tf.distribute.InputContext, *, cache: bool = False,
                  shuffle_buffer: int = 10_000, seed: Optional[int] = None,
                  start_step: int = 0, memory_bound: Optional[int] = None
                  ) -> tf.data.Dataset:
    """One pipeline's endless stream of shuffled, normalized per-replica batches (dicts).

    ``start_step``: global steps already trained; with a seed the stream
    continues after the batches they consumed. ``cache``: hold this
    pipeline's share decoded in memory (`trainer.data.in_memory`) when it
    fits ``memory_bound`` bytes (by default `in_memory.memory_bound` of this
    host's memory), else stream it from the files; the log says which.
    """
    if cache and _holds_in_memory(split, ctx, memory_bound, shuffle_buffer):
        return _in_memory_dataset(split, global_batch_size, ctx, seed, start_step)
    return _streaming_dataset(split, global_batch_size, ctx, shuffle_buffer, seed,
                              start_step)


def _holds_in_memory(split: SplitFiles, ctx: tf.distribute.InputContext,
                     memory_bound: Optional[int], shuffle_buffer: int) -> bool:
    """Whether this pipeline's share fits the bound; one log line either way."""
    share = pipeline_example_counts(split.counts, ctx.num_input_pipelines)[
        ctx.input_pipeline_id]
    if memory_bound is None:
        memory, what = in_memory.available_memory()
        memory_bound = in_memory.memory_bound(memory)
        origin = f"{in_memory.MEMORY_FRACTION:g} of {what}, {_size(memory)}"
    else:
        origin = "as given"
    fits = in_memory.fits_in_memory(share, memory_bound)
    log.info("split %r, input pipeline %d/%d: --cache: %s examples take %s decoded, "
             "%s the in-memory bound of %s (%s): %s", split.name, ctx.input_pipeline_id,
             ctx.num_input_pipelines, f"{share:,}", _size(in_memory.decoded_bytes(share)),
             "within" if fits else "over", _size(memory_bound), origin,
             "decoded once, each epoch a permutation" if fits else
             f"streamed from the files through a {shuffle_buffer}-record shuffle buffer")
    return fits


def _size(num_bytes: int) -> str:
    return f"{num_bytes / 1e6:,.1f} MB"


def decode_share(split: SplitFiles, ctx: tf.distribute.InputContext) -> dict[str, tf.Tensor]:
    """This pipeline's share of ``split``, decoded and checked: uint8 images,
    labels and indices, rows in the (deterministic) order of `_records`.

    Runs eagerly, once per stream, on the device ``dataset_fn`` runs under
    (the host's CPU); a bad record raises here, before training starts.
    """
    fmt = split.image_format
    parts = list(_records(split, ctx, training=False, seed=None)
                 .batch(DECODE_BLOCK)
                 .map(lambda s: decode_batch(s, fmt), num_parallel_calls=AUTOTUNE,
                      deterministic=True))
    return {key: tf.concat([part[key] for part in parts], axis=0)
            for key in (contract.IMAGE_KEY, contract.LABEL_KEY, contract.INDEX_KEY)}


def _in_memory_dataset(split: SplitFiles, global_batch_size: int,
                       ctx: tf.distribute.InputContext, seed: Optional[int],
                       start_step: int) -> tf.data.Dataset:
    """This pipeline's decoded share, batched by `in_memory.row_batches` from
    the batch ``start_step`` reaches (seeded) or from batch 0 under a fresh
    random key (unseeded)."""
    per_replica = ctx.get_per_replica_batch_size(global_batch_size)
    arrays = decode_share(split, ctx)
    n = int(arrays[contract.LABEL_KEY].shape[0])
    first = 0
    if seed is None:
        seed = int(np.random.default_rng().integers(np.iinfo(np.int64).max))
    elif start_step:
        first = consumed_batches(start_step, ctx)
        log.info("split %r: resuming the seeded in-memory input at step %d: epoch %d "
                 "of the share, from its example %d", split.name, start_step,
                 first * per_replica // n, first * per_replica % n)
    rows = in_memory.row_batches(n, per_replica, first, (seed, ctx.input_pipeline_id))
    # One map for the gather and the normalization; deterministic, so the
    # batches keep the stream's order.
    return rows.map(lambda r: _train_form(in_memory.gather(arrays, r)),
                    num_parallel_calls=AUTOTUNE, deterministic=True)


def _streaming_dataset(split: SplitFiles, global_batch_size: int,
                       ctx: tf.distribute.InputContext, shuffle_buffer: int,
                       seed: Optional[int], start_step: int) -> tf.data.Dataset:
    """Records read from the files every epoch, shuffled through a buffer,
    batched, then parsed; a seeded resume skips (reads, does not parse) the
    records the first ``start_step`` steps consumed."""
    per_replica = ctx.get_per_replica_batch_size(global_batch_size)
    ds = _records(split, ctx, training=True, seed=seed)
    ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    ds = ds.repeat().batch(per_replica, drop_remainder=True)
    if start_step and seed is not None:
        consumed = consumed_batches(start_step, ctx)
        log.info("split %r: resuming the seeded input at step %d (skipping %d "
                 "batches of %d)", split.name, start_step, consumed, per_replica)
        ds = ds.skip(consumed)
    # Deterministic, so batches keep their order and every epoch's examples
    # come before the next epoch's (the shuffle + repeat above guarantee
    # that); the file interleave already absorbs slow reads.
    fmt = split.image_format
    return ds.map(lambda s: _parse_batch(s, fmt), num_parallel_calls=AUTOTUNE,
                  deterministic=True)


def eval_dataset(split: SplitFiles, global_batch_size: int,
                 ctx: tf.distribute.InputContext, *, cache: bool = False) -> tf.data.Dataset:
    """One pipeline's endless eval stream, in whole passes of `eval_steps` steps.

    Every example once per pass; partial and missing batches are padded with
    weight-0 rows, so every replica runs the same number of steps with
    static shapes.
    """
    replicas, num_pipelines = ctx.num_replicas_in_sync, ctx.num_input_pipelines
    per_replica = ctx.get_per_replica_batch_size(global_batch_size)
    steps = eval_steps(split.counts, global_batch_size, replicas, num_pipelines)
    fmt = split.image_format
    ds = _records(split, ctx, training=False, seed=None)
    ds = ds.batch(per_replica, drop_remainder=False)
    ds = ds.map(lambda s: _pad_batch(_parse_batch(s, fmt), per_replica),
                num_parallel_calls=AUTOTUNE, deterministic=True)
    padding = tf.data.Dataset.from_tensors(
        _pad_batch(_parse_batch(tf.zeros([0], tf.string), fmt), per_replica))
    ds = ds.concatenate(padding.repeat()).take(steps * (replicas // num_pipelines))
    if cache:
        ds = ds.cache()
    # Endless, in whole passes: each `steps` global steps are one full pass,
    # so a loop that keeps one iterator stays aligned.
    return ds.repeat()


_verified: set[tuple[str, str]] = set()  # (path, sha256) checked in this process


def verify_pipeline_files(split: SplitFiles, ctx: tf.distribute.InputContext) -> None:
    """``--verify_checksums``: the sha256 of each file this input pipeline reads."""
    for path, sha in zip(split.files, split.sha256s):
        if path in pipeline_files(split, ctx) and (path, sha) not in _verified:
            checks.verify_checksums([path], [sha])
            _verified.add((path, sha))


def _finish(ds: tf.data.Dataset, postprocess: Postprocess) -> tf.data.Dataset:
    if postprocess is not None:
        ds = ds.map(postprocess)
    return ds.prefetch(AUTOTUNE)


def train_input(strategy: tf.distribute.Strategy, split: SplitFiles,
                settings: InputSettings, *, start_step: int = 0,
                postprocess: Postprocess = None):
    """The distributed (endless) train dataset for ``strategy``, read with
    ``settings`` (batch, cache, seed, shuffle buffer, checksums).

    ``postprocess`` maps each batch dict (image, label, index, weight) to
    the form a loop wants; ``start_step`` resumes a seeded stream. Without a
    seed a resumed run draws a fresh shuffle. The steps of an epoch are
    `steps_per_epoch`.
    """
    if start_step and settings.seed is None:
        log.info("split %r: resuming at step %d without --seed: a fresh shuffle",
                 split.name, start_step)

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        if settings.verify_checksums:
            verify_pipeline_files(split, ctx)
        return _finish(train_dataset(split, settings.global_batch_size, ctx,
                                     cache=settings.cache, seed=settings.seed,
                                     shuffle_buffer=settings.shuffle_buffer,
                                     start_step=start_step), postprocess)
    return strategy.distribute_datasets_from_function(dataset_fn)


def eval_input(strategy: tf.distribute.Strategy, split: SplitFiles,
               settings: InputSettings, *, postprocess: Postprocess = None):
    """``(distributed eval dataset, global steps per pass)`` for ``strategy``,
    read with ``settings`` (its batch, cache and checksums).

    The step count depends on the number of input pipelines, which only the
    strategy knows; it hands every pipeline the same count in its
    `InputContext`, so the steps computed there are the steps.
    """
    steps = set()

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        steps.add(eval_steps(split.counts, settings.global_batch_size,
                             ctx.num_replicas_in_sync, ctx.num_input_pipelines))
        dataset = _finish(eval_dataset(split, settings.global_batch_size, ctx,
                                       cache=settings.cache), postprocess)
        if settings.verify_checksums:  # the dataset has read nothing yet
            verify_pipeline_files(split, ctx)
        return dataset
    dataset = strategy.distribute_datasets_from_function(dataset_fn)
    (count,) = steps
    return dataset, count


def find_bad_file(split: SplitFiles) -> Optional[tuple[str, str]]:
    """Reads each file alone; ``(path, what is wrong)`` for the first one that is
    corrupt (its framing) or holds a record that is no MNIST example; None if
    every file reads.

    Used after a ``DataLossError`` ("corrupted record at <offset>") or an
    ``InvalidArgumentError`` (a failed check of `decode_batch`), neither of
    which names the file.
    """
    for path in split.files:
        try:
            offset = 0
            for batch in tf.data.TFRecordDataset(
                    path, compression_type=split.compression_type).batch(4096):
                found = checks.bad_record(batch.numpy(), split.image_format)
                if found is not None:
                    index, what = found
                    return path, f"record {offset + index} of split {split.name!r}: {what}"
                offset += int(batch.shape[0])
        except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
            return path, f"corrupt TFRecord data ({summarize_error(e)})"
    return None
