"""Choosing the number of shards and which records go to each, from byte counts.

Records are ordered by their shuffle key. The key's top bits put each record
in a bucket (a contiguous range of that order); per-bucket record and byte
counts are cheap to aggregate, and cutting the ordered buckets at multiples of
``total_bytes / num_shards`` gives shards that differ from the mean by at most
about one bucket. Bucket counts are chosen so a bucket is a small fraction of
a shard. `check_sharding` refuses, before anything runs, flags whose shards
could not be met or would be extreme.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping

from pipeline.errors import PipelineInputError
from pipeline.shard.config import MB, SHARDS


def num_shards_for(total_bytes: int, target_shard_bytes: int, min_shards: int,
                   num_records: int) -> int:
    """`ShardConfig.shard_count`, never more than the records."""
    if target_shard_bytes <= 0:
        raise ValueError("target shard size must be positive")
    wanted = SHARDS.shard_count(total_bytes, target_shard_bytes, min_shards)
    return max(1, min(wanted, num_records))


def bucket_bits_for(estimated_bytes: int, target_shard_bytes: int,
                    min_shards: int) -> int:
    """How many leading key bits name a bucket, for a dataset of about this size."""
    shards = SHARDS.shard_count(estimated_bytes, target_shard_bytes, min_shards)
    bits = math.ceil(math.log2(shards * SHARDS.buckets_per_shard))
    return min(SHARDS.max_bucket_bits, max(SHARDS.min_bucket_bits, bits))


def check_sharding(options, examples_per_split: dict[str, int]) -> dict[str, int]:
    """Refuses sharding that cannot be met, or is extreme without the flag.

    ``options`` is the run's `pipeline.options.Options`. Returns the
    estimated shard count of each split. Sizes are estimated from the record
    count and the image format (`ShardConfig.record_bytes`); gzip only makes
    files smaller, so a refusal never rests on compressed sizes.
    """
    record = SHARDS.record_bytes(options.image_format)
    target = options.target_bytes
    if target < record:
        raise PipelineInputError(f"--target_shard_bytes={target}: a shard would hold "
                                 f"less than one record (~{record} bytes each)")
    return {split: _estimated_shards(options, split, count, record)
            for split, count in examples_per_split.items()}


def open_files_needed(split_spill_files: Mapping[str, int], workers: int) -> int:
    """Open files a local file-shuffle job needs: a shard's merge holds every
    spill file of its split open, and ``workers`` merges run at once."""
    return workers * max(split_spill_files.values(), default=0) + SHARDS.open_file_headroom


def _estimated_shards(options, split: str, count: int, record: int) -> int:
    """One split's shard count for ``count`` records of ``record`` bytes, if acceptable."""
    if options.min_shards > count:
        raise PipelineInputError(f"--min_shards={options.min_shards}: more shards than "
                                 f"records ({split} has {count:,})")
    total = count * record
    target = options.target_bytes
    shards = SHARDS.shard_count(total, target, options.min_shards)
    if options.allow_extreme_sharding:
        return shards
    if shards > SHARDS.max_shards_per_split:
        raise PipelineInputError(
            f"{split}: {shards:,} shards (over {SHARDS.max_shards_per_split:,}); raise "
            "--target_shard_mb, lower --min_shards or pass --allow_extreme_sharding")
    asked = min(target, total / options.min_shards)  # what the flags ask for
    if shards > 1 and asked < SHARDS.small_shard_bytes:
        raise PipelineInputError(
            f"{split}: {shards:,} shards of ~{asked:,.0f} bytes (under "
            f"{SHARDS.small_shard_bytes // MB} MB); raise --target_shard_mb, lower "
            "--min_shards or pass --allow_extreme_sharding")
    return shards


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    """For one split: how many shards, and the shard of every non-empty bucket."""

    num_shards: int
    bucket_to_shard: Mapping[int, int]
    num_records: int
    total_bytes: int


def plan_shards(bucket_sizes: Mapping[int, tuple[int, int]],
                target_shard_bytes: int, min_shards: int) -> ShardPlan:
    """Assigns buckets (id -> (records, bytes)) to shards of near-equal bytes.

    A bucket goes to the shard that holds its byte midpoint. If buckets are so
    coarse that a shard would stay empty, the empty shard is dropped, so every
    listed shard holds records.
    """
    num_records = sum(count for count, _ in bucket_sizes.values())
    total_bytes = sum(size for _, size in bucket_sizes.values())
    if num_records == 0:
        return ShardPlan(0, {}, 0, 0)
    wanted = num_shards_for(total_bytes, target_shard_bytes, min_shards,
                            num_records)
    provisional = {}
    start = 0
    for bucket in sorted(bucket_sizes):
        size = bucket_sizes[bucket][1]
        midpoint = start + size / 2
        provisional[bucket] = min(wanted - 1,
                                  int(midpoint * wanted // max(total_bytes, 1)))
        start += size
    renumber = {old: new for new, old in
                enumerate(sorted(set(provisional.values())))}
    return ShardPlan(num_shards=len(renumber),
                     bucket_to_shard={b: renumber[s]
                                      for b, s in provisional.items()},
                     num_records=num_records, total_bytes=total_bytes)
