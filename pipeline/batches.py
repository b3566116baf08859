"""A source batch made ready to shuffle: shuffle keys, buckets and Example bytes.

Work is done per batch (thousands of records) with numpy where it can be, so
the per-record Python cost is a few byte concatenations.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from mnist_contract import wire
import mnist_contract as contract

from pipeline import records

KEY_BYTES = records.KEY_BYTES
shuffle_keys = records.shuffle_keys


def buckets_of(keys: np.ndarray, bucket_bits: int) -> np.ndarray:
    """The top ``bucket_bits`` bits of each key [n, 16], as int64 [n].

    A bucket is thus a contiguous range of the sort order.
    """
    top = np.ascontiguousarray(keys[:, :4]).view(">u4").reshape(-1)
    return (top >> (32 - bucket_bits)).astype(np.int64)


def key_order(keys: np.ndarray) -> np.ndarray:
    """The permutation that sorts keys [n, 16] bytewise (as `sorted` on bytes would)."""
    halves = np.ascontiguousarray(keys).view(">u8").reshape(-1, 2)
    return np.lexsort((halves[:, 1], halves[:, 0]))


def encode_examples(batch, image_format: str) -> list[bytes]:
    """The serialized Example of each record of a `sources.Batch`."""
    return wire.encode_examples({contract.IMAGE_KEY: batch.images,
                                 contract.LABEL_KEY: batch.labels,
                                 contract.INDEX_KEY: batch.indices}, image_format)


def encode_batch(batch, salt: str, split: str, image_format: str,
                 bucket_bits: int) -> tuple[np.ndarray, np.ndarray, list[bytes]]:
    """(buckets [n], keys [n, 16], Example bytes [n]) of a batch, in source order."""
    keys = shuffle_keys(salt, split, batch.indices)
    return buckets_of(keys, bucket_bits), keys, encode_examples(batch, image_format)


def group_by_bucket(buckets: np.ndarray, keys: np.ndarray, examples: list[bytes]
                    ) -> Iterator[tuple[int, list[tuple[bytes, bytes]]]]:
    """(bucket, [(key, Example bytes), ...]) per non-empty bucket, keys in order."""
    order = key_order(keys)
    key_bytes = keys.tobytes()
    sorted_buckets = buckets[order]
    cuts = np.flatnonzero(np.diff(sorted_buckets)) + 1
    for part in np.split(order, cuts):
        if len(part):
            yield int(buckets[part[0]]), [
                (key_bytes[i * KEY_BYTES:(i + 1) * KEY_BYTES], examples[i])
                for i in part.tolist()]
