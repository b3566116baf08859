"""Streaming shard writes and the sorted spill files of the file-based shuffle.

A spill file holds one read task's records sorted by shuffle key, each as
``key (16 bytes) + the record exactly as the shard will hold it`` (the
serialized Example in TFRecord framing). Because the order is by key, every
bucket -- and so every shard's share -- is one contiguous byte range of the
file. A shard is written by merging its ranges from all spill files, reading
each in small chunks, so memory stays flat however large the dataset or the
shard. The merge copies the framed bytes as they are: each record is framed
(and its CRC computed) once, and its CRCs are checked once, when the spill
is read back, so a damaged spill file fails the job instead of reaching a
shard.
"""

from __future__ import annotations

import hashlib
import struct
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
        self.write_framed(framing.frame_record(example))

    def write_framed(self, framed: bytes) -> None:
        """Writes a record already in TFRecord framing."""
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
                framed: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Writes one key-sorted spill file of framed records; per bucket: ids, start and end offsets."""
    order = key_order(keys).tolist()
    key_bytes = keys.tobytes()
    parts = []
    for i in order:
        parts.append(key_bytes[i * KEY_BYTES:(i + 1) * KEY_BYTES])
        parts.append(framed[i])
    storage.write_bytes(path, b"".join(parts))
    lengths = np.fromiter((len(framed[i]) + KEY_BYTES for i in order), np.int64, len(order))
    ends = np.cumsum(lengths)
    ids, first, counts = np.unique(buckets[order], return_index=True, return_counts=True)
    starts = ends[first] - lengths[first]
    return ids, starts, ends[first + counts - 1]


_FIXED = KEY_BYTES + framing.HEADER_BYTES + 4  # key, length header, data CRC


def _spill_records(f, path: str, start: int, end: int,
                   chunk_bytes: int) -> Iterator[tuple[bytes, bytes]]:
    crc, unpack_from, header = framing.masked_crc, struct.unpack_from, framing.header
    remaining = end - start
    buffer = b""
    consumed = start  # file offset of buffer[0]
    need = 0
    while True:
        offset = 0
        while len(buffer) - offset >= _FIXED:
            at = offset + KEY_BYTES
            (length,) = unpack_from("<Q", buffer, at)
            if buffer[at:at + framing.HEADER_BYTES] != header(length):
                raise IOError(f"spill file damaged: {path}: bad length CRC at byte "
                              f"{consumed + at}")
            stop = offset + _FIXED + length
            if stop > len(buffer):
                need = stop - offset
                break
            data_end = stop - 4
            if unpack_from("<I", buffer, data_end)[0] != crc(
                    buffer[at + framing.HEADER_BYTES:data_end]):
                raise IOError(f"spill file damaged: {path}: bad data CRC in record "
                              f"at byte {consumed + offset}")
            yield buffer[offset:at], buffer[at:stop]
            offset = stop
        buffer = buffer[offset:]
        consumed += offset
        if remaining == 0:
            if buffer:
                raise IOError(f"spill file damaged: {path}: truncated record at byte {consumed}")
            return
        piece = f.read(min(max(chunk_bytes, need), remaining))
        if not piece:
            raise IOError(f"spill file damaged: {path}: ends {remaining} bytes early, "
                          f"at byte {end - remaining}")
        remaining -= len(piece)
        buffer += piece


def iter_spill_range(path: str, start: int, end: int,
                     chunk_bytes: int) -> Iterator[tuple[bytes, bytes]]:
    """Yields (key, framed record) from bytes [start, end) of a spill file, chunk by chunk.

    Both CRCs of every record are checked here, once.
    """
    with FileSystems.open(path, mime_type=_MIME,
                          compression_type=CompressionTypes.UNCOMPRESSED) as f:
        f.seek(start)
        yield from _spill_records(f, path, start, end, chunk_bytes)
