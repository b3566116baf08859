"""Pure per-record functions: encode an Example, its shuffle key, TFRecord framing.

They run inside Beam workers but know nothing of Beam, so they are tested
directly and reused by `pipeline.verify`.
"""

from __future__ import annotations

import hashlib
import io
import struct

import google_crc32c
import numpy as np
import tensorflow as tf
from PIL import Image

from pipeline import contract

# Bytes TFRecord framing adds to each record: length, its CRC, data CRC.
RECORD_OVERHEAD = 16
_CRC_MASK_DELTA = 0xA282EAD8


def encode_image(image: np.ndarray, image_format: str) -> bytes:
    """A 28x28 uint8 image as raw bytes or a grayscale PNG."""
    if image.shape != (contract.IMAGE_HEIGHT, contract.IMAGE_WIDTH):
        raise ValueError(f"image shape {image.shape}, expected 28x28")
    if image_format == "raw":
        return np.ascontiguousarray(image, dtype=np.uint8).tobytes()
    if image_format == "png":
        buffer = io.BytesIO()
        Image.fromarray(np.asarray(image, dtype=np.uint8), mode="L").save(
            buffer, format="PNG", optimize=False, compress_level=6)
        return buffer.getvalue()
    raise ValueError(f"unknown image format {image_format!r}")


def decode_image(data: bytes, image_format: str) -> np.ndarray:
    """Inverse of `encode_image`: a (28, 28) uint8 array."""
    if image_format == "raw":
        if len(data) != contract.IMAGE_BYTES:
            raise ValueError(f"raw image has {len(data)} bytes, expected 784")
        return np.frombuffer(data, dtype=np.uint8).reshape(
            contract.IMAGE_HEIGHT, contract.IMAGE_WIDTH)
    if image_format == "png":
        return np.asarray(Image.open(io.BytesIO(data)), dtype=np.uint8)
    raise ValueError(f"unknown image format {image_format!r}")


def encode_example(image: np.ndarray, label: int, index: int,
                   image_format: str) -> bytes:
    """One serialized tf.train.Example following `pipeline.contract`."""
    feature = {
        contract.IMAGE_KEY: tf.train.Feature(bytes_list=tf.train.BytesList(
            value=[encode_image(image, image_format)])),
        contract.LABEL_KEY: tf.train.Feature(int64_list=tf.train.Int64List(
            value=[int(label)])),
        contract.INDEX_KEY: tf.train.Feature(int64_list=tf.train.Int64List(
            value=[int(index)])),
    }
    return tf.train.Example(features=tf.train.Features(
        feature=feature)).SerializeToString(deterministic=True)


def decode_example(serialized: bytes,
                   image_format: str) -> tuple[np.ndarray, int, int]:
    """(image (28, 28) uint8, label, index) from a serialized Example."""
    example = tf.train.Example.FromString(serialized)
    feature = example.features.feature
    missing = [key for key in (contract.IMAGE_KEY, contract.LABEL_KEY,
                               contract.INDEX_KEY) if key not in feature]
    if missing:
        raise ValueError(f"example lacks feature(s) {missing}")
    image = decode_image(feature[contract.IMAGE_KEY].bytes_list.value[0],
                         image_format)
    return (image, int(feature[contract.LABEL_KEY].int64_list.value[0]),
            int(feature[contract.INDEX_KEY].int64_list.value[0]))


def shuffle_key(salt: str, split: str, index: int) -> bytes:
    """A stable pseudo-random sort key, as TFDS does (md5 of salt and key).

    Sorting by it gives the same global order on any runner and any number
    of workers, so reruns write byte-identical files.
    """
    return hashlib.md5(f"{salt}/{split}/{index}".encode()).digest()


def bucket_of(key: bytes, bucket_bits: int) -> int:
    """The key's top ``bucket_bits`` bits: contiguous ranges of the sort order."""
    return int.from_bytes(key[:4], "big") >> (32 - bucket_bits)


def masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _CRC_MASK_DELTA) & 0xFFFFFFFF


def frame_record(data: bytes) -> bytes:
    """One record in TFRecord framing (what tf.io.TFRecordWriter writes)."""
    length = struct.pack("<Q", len(data))
    return (length + struct.pack("<I", masked_crc(length)) + data +
            struct.pack("<I", masked_crc(data)))


def iter_framed_records(data: bytes, origin: str):
    """Yields the records of an uncompressed TFRecord file, checking CRCs."""
    offset = 0
    while offset < len(data):
        if offset + 12 > len(data):
            raise ValueError(f"{origin}: truncated record header at byte {offset}")
        length_bytes = data[offset:offset + 8]
        (length,) = struct.unpack("<Q", length_bytes)
        (length_crc,) = struct.unpack("<I", data[offset + 8:offset + 12])
        if length_crc != masked_crc(length_bytes):
            raise ValueError(f"{origin}: bad length CRC at byte {offset}")
        start, end = offset + 12, offset + 12 + length
        if end + 4 > len(data):
            raise ValueError(f"{origin}: truncated record at byte {offset}")
        record = data[start:end]
        (data_crc,) = struct.unpack("<I", data[end:end + 4])
        if data_crc != masked_crc(record):
            raise ValueError(f"{origin}: bad data CRC in record at byte {offset}")
        yield record
        offset = end + 4
