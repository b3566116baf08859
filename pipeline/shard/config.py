"""Every size the conversion job reasons with, in one `ShardConfig`, and where spills go.

Record sizes per image format come from the data contract
(`mnist_contract.sizes`), so the job's estimates and the manifest's
plausibility check rest on the same facts. Imports neither Beam nor
TensorFlow: the command line checks flags with it before either loads.
"""

from __future__ import annotations

import dataclasses
import math

import mnist_contract as contract

MB = 1_000_000
KEY_BYTES = 16  # a shuffle key: two 64-bit words
SPILL_DIR = "spill"  # the file shuffle's spill files, under the run's temp folder


@dataclasses.dataclass(frozen=True)
class ShardConfig:
    """Shard limits, bucket sizing, spill file layout and merge memory.

    ``bucket_record_bytes`` is one estimate for both image formats, unlike
    `record_bytes`: the bucket bits it yields decide which records share a
    shard, so it is the one number here that fixes the bytes written, and
    any change to it changes the shards of every dataset written with the
    same flags. The per-format sizes serve the checks and estimates that
    only report (refusals, progress lines).
    """

    small_shard_bytes: int = 1 * MB  # below this a shard is "tiny" (refused unless allowed)
    max_shards_per_split: int = 10_000
    buckets_per_shard: int = 256  # so a shard differs from the mean by ~1/256
    min_bucket_bits: int = 6
    max_bucket_bits: int = 20
    bucket_record_bytes: int = contract.IMAGE_BYTES + 64
    key_bytes: int = KEY_BYTES
    length_bytes: int = 4  # a spill file's footer: each record's length, u32
    merge_memory_bytes: int = 8 << 20  # bytes a shard merge reads at a time
    # open files a local job needs besides the spill files its merges hold open
    open_file_headroom: int = 256

    def shard_count(self, total_bytes: float, target_shard_bytes: float,
                    min_shards: int) -> int:
        """``max(min_shards, ceil(total / target))``: the shard count a split of
        ``total_bytes`` gets, from the plan, the bucket sizing and the check of
        the flags alike (`pipeline.shard.sharding`), so all three agree."""
        return max(min_shards, math.ceil(total_bytes / target_shard_bytes), 1)

    def record_bytes(self, image_format: str) -> int:
        """A typical framed record of ``image_format`` in a shard."""
        return contract.RECORD_SIZES[image_format].typical

    @property
    def spill_index_bytes(self) -> int:
        """Footer bytes per record of a spill file: its key and its length."""
        return self.key_bytes + self.length_bytes


SHARDS = ShardConfig()
