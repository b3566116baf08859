"""The shuffle keys: where each record goes in the job's global order.

Encoding records and TFRecord framing belong to the data contract
(`mnist_contract.examples`, `mnist_contract.framing`); what is here decides
only where a record goes (its bucket is the key's top bits,
`pipeline.batches.buckets_of`).
"""

from __future__ import annotations

import hashlib

import numpy as np

KEY_BYTES = 16
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

