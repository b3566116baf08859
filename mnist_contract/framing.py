"""TFRecord framing: one streaming codec for every reader and writer of it.

A record is ``length (u64 LE) | masked crc32c(length) | data | masked
crc32c(data)``, exactly what ``tf.io.TFRecordWriter`` writes. The pipeline
frames shards and its spill files with `frame_record`, and `iter_records`
reads any of them back chunk by chunk, so memory stays flat whatever the
file size.
"""

from __future__ import annotations

import functools
import struct
from typing import BinaryIO, Iterator, Optional, Sequence

import google_crc32c
import numpy as np

HEADER_BYTES = 12
_CRC_MASK_DELTA = 0xA282EAD8


class FramingError(ValueError):
    """A damaged or truncated TFRecord stream; the message names the origin and offset."""


def masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _CRC_MASK_DELTA) & 0xFFFFFFFF


@functools.lru_cache(maxsize=4096)
def header(length: int) -> bytes:
    """The 12 bytes before a record's data: its length and the length's CRC."""
    packed = struct.pack("<Q", length)
    return packed + struct.pack("<I", masked_crc(packed))


def frame_record(data: bytes) -> bytes:
    """One record in TFRecord framing (what tf.io.TFRecordWriter writes)."""
    return header(len(data)) + data + struct.pack("<I", masked_crc(data))


def frame_records(records: Sequence[bytes]) -> list[bytes]:
    """`frame_record` of each record: the CRCs masked with numpy for the whole
    batch, headers shared between equal lengths."""
    crcs = np.fromiter(map(google_crc32c.value, records), np.uint32, len(records))
    masked = (((crcs >> np.uint32(15)) | (crcs << np.uint32(17)))
              + np.uint32(_CRC_MASK_DELTA)).astype("<u4").tobytes()
    return [header(len(data)) + data + masked[i:i + 4]
            for i, data in zip(range(0, 4 * len(records), 4), records)]


def frame_rows(rows: np.ndarray) -> np.ndarray:
    """`frame_record` of each row of a uint8 [m, length] array, as rows [m, length + 16].

    All records share one header; only the data CRC is computed per row,
    on the rows themselves (google_crc32c takes a contiguous array).
    """
    m, length = rows.shape
    rows = np.ascontiguousarray(rows, dtype=np.uint8)
    crcs = np.fromiter(map(google_crc32c.value, rows), np.uint32, m)
    masked = ((crcs >> np.uint32(15)) | (crcs << np.uint32(17))) + np.uint32(_CRC_MASK_DELTA)
    framed = np.empty((m, length + HEADER_BYTES + 4), np.uint8)
    framed[:, :HEADER_BYTES] = np.frombuffer(header(length), np.uint8)
    framed[:, HEADER_BYTES:HEADER_BYTES + length] = rows
    framed[:, HEADER_BYTES + length:] = masked.astype("<u4").view(np.uint8).reshape(m, 4)
    return framed


def _record_end(buffer: bytes, offset: int, at: int, origin: str) -> int:
    """Where the record whose header starts at ``buffer[offset]`` ends, once its
    length CRC checks (``at``: that header's byte in the stream, for the error)."""
    length_bytes = buffer[offset:offset + 8]
    if struct.unpack_from("<I", buffer, offset + 8)[0] != masked_crc(length_bytes):
        raise FramingError(f"{origin}: bad length CRC at byte {at}")
    (length,) = struct.unpack("<Q", length_bytes)
    return offset + HEADER_BYTES + length + 4


def iter_records(stream: BinaryIO, origin: str, *, limit: Optional[int] = None,
                 start_offset: int = 0, chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
    """Yields each record's data from ``stream``, checking both CRCs.

    Reads ``chunk_bytes`` at a time and at most ``limit`` bytes (all of the
    stream when None). ``start_offset`` only numbers the bytes in error
    messages (for a stream positioned inside a file).
    """
    remaining = limit
    buffer = b""
    consumed = start_offset  # stream offset of buffer[0]
    eof = False
    while True:
        offset = 0
        while len(buffer) - offset >= HEADER_BYTES:
            stop = _record_end(buffer, offset, consumed + offset, origin)
            if stop > len(buffer):
                if eof:
                    break
                # Grow the read so a record larger than a chunk still arrives whole.
                chunk_bytes = max(chunk_bytes, stop - offset)
                break
            data = buffer[offset + HEADER_BYTES:stop - 4]
            if struct.unpack_from("<I", buffer, stop - 4)[0] != masked_crc(data):
                raise FramingError(
                    f"{origin}: bad data CRC in record at byte {consumed + offset}")
            yield data
            offset = stop
        buffer = buffer[offset:]
        consumed += offset
        if eof:
            if buffer:
                raise FramingError(f"{origin}: truncated record at byte {consumed}")
            return
        want = chunk_bytes if remaining is None else min(chunk_bytes, remaining)
        piece = stream.read(want) if want > 0 else b""
        if remaining is not None:
            remaining -= len(piece)
        if not piece and remaining:
            raise FramingError(f"{origin}: ends {remaining} bytes early, "
                               f"at byte {consumed + len(buffer)}")
        eof = not piece or remaining == 0
        buffer += piece
