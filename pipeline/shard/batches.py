"""A source batch made ready to shuffle: shuffle keys, buckets and Example bytes.

The shuffle key decides where a record goes in the job's global order (its
bucket is the key's top bits, `buckets_of`); encoding records and TFRecord
framing belong to the data contract (`mnist_contract.examples`,
`mnist_contract.framing`). Work is done per batch (thousands of records) with
numpy where it can be, so the per-record Python cost is a few byte
concatenations.
"""

from __future__ import annotations

import hashlib
from typing import Iterator

import numpy as np

from mnist_contract import wire
import mnist_contract as contract

from pipeline.shard.config import KEY_BYTES

_U64 = np.uint64


def _mix64(x: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finalizer: a bijection of uint64 with full avalanche."""
    x = x ^ (x >> _U64(33))
    x = x * _U64(0xFF51AFD7ED558CCD)
    x = x ^ (x >> _U64(33))
    x = x * _U64(0xC4CEB9FE1A85EC53)
    return x ^ (x >> _U64(33))


def shuffle_keys(salt: str, split: str, indices: np.ndarray) -> np.ndarray:
    """Stable pseudo-random sort keys of record indices, as uint8 [n, 16].

    Sorting by them gives the same global order on any runner and any number
    of workers, so reruns write byte-identical files; another salt or split,
    another order. The first 8 bytes are a keyed bijection of the index
    (md5 of salt and split gives the two 64-bit keys), so no two records of
    a split share a key, and the whole batch is a few numpy operations
    instead of a hash call per record.
    """
    seeds = np.frombuffer(hashlib.md5(f"{salt}/{split}".encode()).digest(), ">u8")
    with np.errstate(over="ignore"):
        ids = np.asarray(indices, dtype=np.int64).reshape(-1).astype(_U64)
        first = _mix64(_mix64(ids ^ seeds[0]) ^ seeds[1])
        second = _mix64(first ^ seeds[0])
    words = np.stack([first, second], axis=1).astype(">u8")
    return words.view(np.uint8).reshape(-1, KEY_BYTES)


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
    """The serialized Example of each record of a `pipeline.source.sources.Batch`."""
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
