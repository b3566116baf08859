"""Pure per-record functions of the job: the shuffle key and its bucket.

Encoding records and TFRecord framing belong to the data contract
(`mnist_contract.examples`, `mnist_contract.framing`); what is here decides
only where a record goes.
"""

from __future__ import annotations

import hashlib


def shuffle_key(salt: str, split: str, index: int) -> bytes:
    """A stable pseudo-random sort key, as TFDS does (md5 of salt and key).

    Sorting by it gives the same global order on any runner and any number
    of workers, so reruns write byte-identical files.
    """
    return hashlib.md5(f"{salt}/{split}/{index}".encode()).digest()


def bucket_of(key: bytes, bucket_bits: int) -> int:
    """The key's top ``bucket_bits`` bits: contiguous ranges of the sort order."""
    return int.from_bytes(key[:4], "big") >> (32 - bucket_bits)
