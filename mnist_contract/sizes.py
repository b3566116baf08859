"""How many bytes one record of each image format takes in a shard.

These are the one statement of record sizes. The manifest's plausibility
check (a shard's record count must fit in its bytes) needs the smallest
record there can be; the conversion job's sharding checks and its progress
estimates need the typical one (`pipeline.shard.config.ShardConfig` derives
from these). Standard library only, like the rest of the contract's core.
"""

from __future__ import annotations

import dataclasses

from mnist_contract.spec import IMAGE_BYTES

# Bytes TFRecord framing adds to each record: length (8), its CRC (4), data CRC (4).
FRAMING_BYTES = 16
# Deflate cannot shrink data by more than ~1032x, which bounds gzip shards.
GZIP_MAX_RATIO = 1032


@dataclasses.dataclass(frozen=True)
class RecordSize:
    """One image format's framed record: the smallest possible, and the typical size."""

    smallest: int  # TFRecord framing plus the smallest serialized Example
    typical: int  # what a real digit takes, to estimate shard counts before a run


RECORD_SIZES = {
    # A raw image is always 784 bytes; label, index and the Example's own
    # structure add the rest. The typical size is exact for indices from
    # 16,384 up (most of MNIST); records below are one or two bytes smaller.
    "raw": RecordSize(smallest=FRAMING_BYTES + IMAGE_BYTES + 20, typical=856),
    # The smallest valid 28x28 grayscale PNG is about 60 bytes; real digits
    # take about 180-460 bytes framed, 346 on average.
    "png": RecordSize(smallest=FRAMING_BYTES + 60, typical=346),
}


def max_plausible_examples(num_bytes: int, image_format: str, compression: str) -> int:
    """The most records a shard of ``num_bytes`` stored bytes can hold."""
    stored = num_bytes * (GZIP_MAX_RATIO if compression == "gzip" else 1)
    return stored // RECORD_SIZES[image_format].smallest
