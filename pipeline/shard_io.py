"""Streaming shard writes and the sorted spill files of the file-based shuffle.

A spill file holds one read task's records sorted by shuffle key, each framed
as a TFRecord whose payload is ``key (16 bytes) + serialized Example``.
Because the order is by key, every bucket -- and so every shard's share -- is
one contiguous byte range of the file. A shard is written by merging its
ranges from all spill files, reading each in small chunks, so memory stays
flat however large the dataset or the shard.
"""

from __future__ import annotations

import hashlib
import zlib
from typing import Iterator

import numpy as np
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from mnist_contract import framing
from pipeline import storage
from pipeline.batches import KEY_BYTES, key_order

_MIME = "application/octet-stream"


class ShardFileWriter:
    """Writes framed records to ``path``, counting and hashing the stored bytes."""

    def __init__(self, path: str, compression: str):
        self._file = FileSystems.create(path, mime_type=_MIME,
                                        compression_type=CompressionTypes.UNCOMPRESSED)
        # wbits=31: a gzip stream with mtime 0, so output is byte-reproducible.
        self._gzip = zlib.compressobj(6, zlib.DEFLATED, 31) if compression == "gzip" else None
        self._sha256 = hashlib.sha256()
        self.num_examples = 0
        self.num_bytes = 0
        self._pending: list[bytes] = []
        self._pending_bytes = 0

    def _emit(self, data: bytes) -> None:
        if self._gzip:
            data = self._gzip.compress(data)
        if data:
            self._file.write(data)
            self._sha256.update(data)
            self.num_bytes += len(data)

    def write(self, example: bytes) -> None:
        framed = framing.frame_record(example)
        self._pending.append(framed)
        self._pending_bytes += len(framed)
        self.num_examples += 1
        if self._pending_bytes >= 1 << 20:
            self._emit(b"".join(self._pending))
            self._pending, self._pending_bytes = [], 0

    def write_all(self, examples) -> None:
        for example in examples:
            self.write(example)

    def close(self) -> dict:
        self._emit(b"".join(self._pending))
        self._pending = []
        if self._gzip:
            tail = self._gzip.flush()
            self._file.write(tail)
            self._sha256.update(tail)
            self.num_bytes += len(tail)
        self._file.close()
        return {"num_examples": self.num_examples, "num_bytes": self.num_bytes,
                "sha256": self._sha256.hexdigest()}


def write_spill(path: str, buckets: np.ndarray, keys: np.ndarray,
                examples: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Writes one key-sorted spill file; returns per bucket: ids, start and end offsets."""
    order = key_order(keys)
    key_bytes = keys.tobytes()
    chunks = [framing.frame_record(key_bytes[i * KEY_BYTES:(i + 1) * KEY_BYTES] + examples[i])
              for i in order.tolist()]
    storage.write_bytes(path, b"".join(chunks))
    lengths = np.fromiter(map(len, chunks), np.int64, len(chunks))
    ends = np.cumsum(lengths)
    ids, first, counts = np.unique(buckets[order], return_index=True, return_counts=True)
    starts = ends[first] - lengths[first]
    return ids, starts, ends[first + counts - 1]


def iter_spill_range(path: str, start: int, end: int,
                     chunk_bytes: int) -> Iterator[tuple[bytes, bytes]]:
    """Yields (key, example) from bytes [start, end) of a spill file, chunk by chunk."""
    with FileSystems.open(path, mime_type=_MIME,
                          compression_type=CompressionTypes.UNCOMPRESSED) as f:
        f.seek(start)
        try:
            for payload in framing.iter_records(f, path, limit=end - start,
                                                start_offset=start,
                                                chunk_bytes=chunk_bytes):
                yield payload[:KEY_BYTES], payload[KEY_BYTES:]
        except framing.FramingError as e:
            raise IOError(f"spill file damaged: {e}") from None
