"""The IDX file format of the canonical MNIST distribution.

An IDX file is a big-endian header -- two zero bytes, a type code (0x08 for
unsigned bytes), the number of dimensions, then one uint32 per dimension --
followed by the array data. MNIST ships them gzip-compressed.
"""

from __future__ import annotations

import gzip
import struct
import zlib

import numpy as np

import mnist_contract as contract
from pipeline.errors import PipelineInputError

UBYTE_TYPE = 0x08
IMAGES_MAGIC = 0x00000803  # uint8, 3 dimensions
LABELS_MAGIC = 0x00000801  # uint8, 1 dimension

# Split name -> (images file, labels file), as published.
MNIST_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}


def gunzip(data: bytes, origin: str) -> bytes:
    """Decompresses a whole .gz file, naming ``origin`` if it is damaged."""
    try:
        return gzip.decompress(data)
    except (EOFError, OSError, zlib.error) as e:
        raise PipelineInputError(
            f"{origin}: truncated or corrupt gzip data ({e})") from None


def decode_idx(data: bytes, expected_magic: int, origin: str) -> np.ndarray:
    """Decodes an uncompressed IDX file into a uint8 array."""
    if len(data) < 4:
        raise PipelineInputError(f"{origin}: too short for an IDX header")
    (magic,) = struct.unpack(">I", data[:4])
    if magic != expected_magic:
        raise PipelineInputError(
            f"{origin}: wrong IDX magic number 0x{magic:08x} "
            f"(expected 0x{expected_magic:08x})")
    ndim = magic & 0xFF
    header_len = 4 + 4 * ndim
    if len(data) < header_len:
        raise PipelineInputError(f"{origin}: IDX header cut short")
    dims = struct.unpack(f">{ndim}I", data[4:header_len])
    expected_len = header_len + int(np.prod(dims, dtype=np.int64))
    if len(data) != expected_len:
        raise PipelineInputError(
            f"{origin}: IDX header promises {dims} = {expected_len} bytes "
            f"but the file has {len(data)}")
    return np.frombuffer(data, dtype=np.uint8, offset=header_len).reshape(dims)


def encode_idx(array: np.ndarray) -> bytes:
    """Inverse of `decode_idx` for uint8 arrays (used to package samples)."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    magic = (UBYTE_TYPE << 8) | array.ndim
    return struct.pack(f">I{array.ndim}I", magic, *array.shape) + array.tobytes()


def check_split(images: np.ndarray, labels: np.ndarray, images_origin: str,
                labels_origin: str) -> None:
    """Checks the MNIST invariants that a well-formed IDX pair can still break."""
    if images.shape[1:] != (contract.IMAGE_HEIGHT, contract.IMAGE_WIDTH):
        raise PipelineInputError(
            f"{images_origin}: images are {images.shape[1]}x{images.shape[2]}, "
            f"expected {contract.IMAGE_HEIGHT}x{contract.IMAGE_WIDTH}")
    if images.shape[0] != labels.shape[0]:
        raise PipelineInputError(
            f"{labels_origin}: {labels.shape[0]} labels for "
            f"{images.shape[0]} images in {images_origin}")
    if labels.size and int(labels.max()) >= contract.NUM_CLASSES:
        bad = int(np.argmax(labels >= contract.NUM_CLASSES))
        raise PipelineInputError(
            f"{labels_origin}: label {int(labels[bad])} at index {bad} "
            f"is outside 0-{contract.NUM_CLASSES - 1}")


def decode_split(images_gz: bytes, labels_gz: bytes, images_origin: str,
                 labels_origin: str) -> tuple[np.ndarray, np.ndarray]:
    """Both files of a split → (images [N, 28, 28] uint8, labels [N] int64)."""
    images = decode_idx(gunzip(images_gz, images_origin), IMAGES_MAGIC,
                        images_origin)
    labels = decode_idx(gunzip(labels_gz, labels_origin), LABELS_MAGIC,
                        labels_origin)
    check_split(images, labels, images_origin, labels_origin)
    return images, labels.astype(np.int64)


class GzipReader:
    """The data of a gzip stream, decompressed from pieces of ``PIECE`` bytes.

    `gzip.GzipFile` (Python 3.11) reads its input 8 KiB at a time and runs
    Python code for each piece; this reads large pieces and leaves each
    member's CRC and length check to zlib. As in `gzip`, members may follow
    one another and zero bytes may pad the end; an empty stream has no data.
    Raises `EOFError` if the stream ends inside a member, `zlib.error` on
    damaged data.
    """

    PIECE = 256 << 10

    def __init__(self, raw):
        self._raw = raw
        self._input = b""  # compressed bytes read and not yet decompressed
        self._member = None  # the current member's decompressor, None between members

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes of data; fewer only at the end of the stream."""
        parts, have = [], 0
        while have < n:
            if self._member is None and not self._start_member():
                break
            data = self._member.decompress(self._input, n - have)
            if self._member.eof:
                self._input, self._member = self._member.unused_data, None
            else:
                self._input = self._member.unconsumed_tail
                if not data and not self._input:
                    self._input = self._raw.read(self.PIECE)
                    if not self._input:
                        raise EOFError("the compressed data ends inside a gzip member")
            parts.append(data)
            have += len(data)
        return b"".join(parts)

    def _start_member(self) -> bool:
        """Begins the next member; False at the end of the stream."""
        while not self._input.lstrip(b"\0"):
            self._input = self._raw.read(self.PIECE)
            if not self._input:
                return False
        self._input = self._input.lstrip(b"\0")
        self._member = zlib.decompressobj(wbits=31)
        return True


class IdxStream:
    """Reads a gzip-compressed IDX file front to back, a block of rows at a time.

    Only the header and the rows asked for are in memory, so memory does not
    grow with the file. Errors name ``origin`` as `decode_idx` does.
    """

    def __init__(self, raw, expected_magic: int, origin: str):
        self._gz = GzipReader(raw)
        self._origin = origin
        head = self._read(4)
        if len(head) < 4:
            raise PipelineInputError(f"{origin}: too short for an IDX header")
        (magic,) = struct.unpack(">I", head)
        if magic != expected_magic:
            raise PipelineInputError(
                f"{origin}: wrong IDX magic number 0x{magic:08x} "
                f"(expected 0x{expected_magic:08x})")
        ndim = magic & 0xFF
        dims_bytes = self._read(4 * ndim)
        if len(dims_bytes) < 4 * ndim:
            raise PipelineInputError(f"{origin}: IDX header cut short")
        self.dims = struct.unpack(f">{ndim}I", dims_bytes)
        self.row_shape = self.dims[1:]
        self._row_bytes = int(np.prod(self.row_shape, dtype=np.int64))
        self._rows_left = self.dims[0]

    def _read(self, n: int) -> bytes:
        try:
            return self._gz.read(n)
        except (EOFError, OSError, zlib.error) as e:
            raise PipelineInputError(
                f"{self._origin}: truncated or corrupt gzip data ({e})") from None

    def read_rows(self, n: int) -> np.ndarray:
        """The next ``min(n, rows left)`` rows as uint8 [rows, *row_shape]."""
        n = min(n, self._rows_left)
        data = self._read(n * self._row_bytes)
        if len(data) != n * self._row_bytes:
            raise PipelineInputError(
                f"{self._origin}: IDX header promises {self.dims} but the data "
                f"ends {n * self._row_bytes - len(data)} bytes early")
        self._rows_left -= n
        return np.frombuffer(data, np.uint8).reshape((n,) + tuple(self.row_shape))

    def check_end(self) -> None:
        """Fails if bytes follow the rows the header promised."""
        if self._rows_left == 0 and self._read(1):
            raise PipelineInputError(
                f"{self._origin}: IDX header promises {self.dims} but the file "
                "has more bytes")


def _check_rows_match_header(stream: IdxStream, rows: int) -> None:
    """Reads ``stream`` to its end, ``rows`` at a time: a file whose data is
    shorter or longer than its header promises is named (`IdxStream`), so a
    count that disagrees with the other file's blames the file that lies."""
    while stream.read_rows(rows).shape[0]:
        pass
    stream.check_end()


def stream_split(images_raw, labels_raw, images_origin: str, labels_origin: str,
                 rows: int):
    """Both files of a split, streamed: (first index, images [n, 28, 28], labels [n] int64).

    The checks of `check_split` run on the headers before any row is read,
    and per block on the labels. When the headers' counts differ, both files
    are read to their ends first, so a file holding fewer or more rows than
    its own header says is the one named.
    """
    images = IdxStream(images_raw, IMAGES_MAGIC, images_origin)
    labels = IdxStream(labels_raw, LABELS_MAGIC, labels_origin)
    empty_images = np.zeros((0,) + tuple(images.row_shape), np.uint8)
    check_split(empty_images, np.zeros(0, np.uint8), images_origin, labels_origin)
    if images.dims[0] != labels.dims[0]:
        _check_rows_match_header(images, rows)
        _check_rows_match_header(labels, rows)
        raise PipelineInputError(f"{labels_origin}: {labels.dims[0]} labels for "
                                 f"{images.dims[0]} images in {images_origin}")
    for start in range(0, images.dims[0], rows):
        block_labels = labels.read_rows(rows)
        block_images = images.read_rows(rows)
        if block_labels.size and int(block_labels.max()) >= contract.NUM_CLASSES:
            bad = int(np.argmax(block_labels >= contract.NUM_CLASSES))
            raise PipelineInputError(
                f"{labels_origin}: label {int(block_labels[bad])} at index "
                f"{start + bad} is outside 0-{contract.NUM_CLASSES - 1}")
        yield start, block_images, block_labels.astype(np.int64)
    images.check_end()
    labels.check_end()
