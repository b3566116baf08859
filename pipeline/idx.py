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
