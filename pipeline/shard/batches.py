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

from mnist_contract import framing, wire
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


def in_key_order(keys: np.ndarray) -> bool:
    """Whether keys [n, 16] are already sorted bytewise (one pass, no sort)."""
    halves = np.ascontiguousarray(keys).view(">u8").reshape(-1, 2)
    high, low = halves[:, 0], halves[:, 1]
    later, same = high[1:] > high[:-1], high[1:] == high[:-1]
    return bool(np.all(later | (same & (low[1:] >= low[:-1]))))


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


def take_rows(array: np.ndarray, order: np.ndarray) -> np.ndarray:
    """``array[order]`` along the first axis, each row moved as one block of bytes."""
    array = np.ascontiguousarray(array)
    row = array.dtype.itemsize * int(np.prod(array.shape[1:], dtype=np.int64))
    if not len(array) or not row:
        return array[order]
    rows = array.reshape(len(array), row // array.dtype.itemsize).view(
        np.dtype((np.void, row))).reshape(-1)
    return rows[order].view(array.dtype).reshape((len(order),) + array.shape[1:])


def _framed_blocks(values: dict, image_format: str) -> tuple[object, np.ndarray]:
    """(the framed records of ``values`` back to back, as bytes or a uint8
    array, each one's length).

    Fixed-width rows (`wire.encode_example_rows`) are framed by numpy when
    the format allows; records of another length than their neighbours
    (a varint crossing 128, 16384, ...) are placed one by one, and PNG
    records go through `wire.encode_examples` and `framing.frame_records`.
    """
    blocks = wire.encode_example_rows(values, image_format)
    if blocks is None:
        framed = framing.frame_records(wire.encode_examples(values, image_format))
        return b"".join(framed), np.fromiter(map(len, framed), np.int64, len(framed))
    if len(blocks) == 1:
        rows = framing.frame_rows(blocks[0][1])
        return rows.reshape(-1), np.full(len(rows), rows.shape[1], np.int64)
    n = sum(len(positions) for positions, _ in blocks)
    parts: list = [b""] * n
    lengths = np.empty(n, np.int64)
    for positions, block in blocks:
        framed = framing.frame_rows(block)
        data, width = framed.tobytes(), framed.shape[1]
        for j, at in enumerate(positions.tolist()):
            parts[at] = data[j * width:(j + 1) * width]
        lengths[positions] = width
    return b"".join(parts), lengths


def spill_batch(batch, salt: str, split: str, image_format: str, bucket_bits: int
                ) -> tuple[np.ndarray, np.ndarray, bytes, np.ndarray]:
    """(buckets [n], keys [n, 16], framed records, their lengths [n]) of a batch,
    all in key order: a spill file's records, encoded straight into that order."""
    keys = shuffle_keys(salt, split, batch.indices)
    order = key_order(keys)
    keys = keys[order]
    values = {contract.IMAGE_KEY: take_rows(batch.images, order),
              contract.LABEL_KEY: batch.labels[order],
              contract.INDEX_KEY: batch.indices[order]}
    data, lengths = _framed_blocks(values, image_format)
    return buckets_of(keys, bucket_bits), keys, data, lengths
